"""The one adapter between protobuf messages and `model` dataclasses (agent and coordinator).

Every message that arrives is validated here: a malformed one raises MessageRejectedError and
never reaches the rest of the code. A text over MAX_TEXT, or a stack too deep or with too many
log lines, is cut (with a mark) rather than refused; in a node report or a stack reply, a rank
whose state is impossible is dropped alone: one worker's data never costs its node's report.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from watchdog.bounded import BoundedTable
from watchdog.errors import MessageRejectedError
from watchdog.model import (
    MAX_FULL_ROWS,
    NO_ACTIVITY,
    NO_EVIDENCE,
    NO_PACE,
    Activity,
    ChildStack,
    ExitReason,
    Frame,
    GroupProgress,
    NodeReport,
    Pace,
    RankStack,
    RankState,
    StackReply,
    StackRequest,
    StatusQuery,
    bounded_frames,
)
from watchdog.text import MAX_TEXT, parse_ranks, printable
from watchdog.transport.limits import (
    CHILD_ROLES,
    MAX_ATTEMPT,
    MAX_CHILD_CPU,
    MAX_CHILD_FRAMES,
    MAX_CHILDREN,
    MAX_FRAMES,
    MAX_LOG_LINES,
    MAX_PID,
    MAX_RANK,
    MAX_REASON_FRAMES,
    MAX_SAMPLES,
    MAX_WORKER_ID,
    MAX_WORLD,
    PROC_STATES,
    SIGNAL,
    check_times,
    checked_rank,
    cut_text,
    cut_texts,
    finite_time,
    say_once,
)
from watchdog.transport.proto import watchdog_pb2 as pb
from watchdog.transport.wire_evidence import (
    environment_from_pb,
    environment_to_pb,
    evidence_from_pb,
    evidence_to_pb,
)

log = logging.getLogger(__name__)

SHARED_BYTES = 8 << 20  # of the distinct stacks kept for ranks alike to share (`bounded`)
M = TypeVar("M")
T = TypeVar("T")


def group_to_pb(g: GroupProgress) -> pb.GroupProgress:
    return pb.GroupProgress(group=g.group, ranks=g.ranks, entered_seq=g.entered_seq,
                            entered_op=g.entered_op, completed_seq=g.completed_seq,
                            entered_at=g.entered_at)


def group_from_pb(m: pb.GroupProgress) -> GroupProgress:
    group, op, entered_at, ranks = m.group, m.entered_op, m.entered_at, tuple(m.ranks)
    if len(group) > MAX_TEXT // 4 or len(op) > MAX_TEXT // 4:
        group, op = cut_texts(group, op)
    if not math.isfinite(entered_at):
        raise MessageRejectedError("a time field is not a finite number")
    if ranks and (min(ranks) < 0 or max(ranks) >= MAX_RANK):
        raise MessageRejectedError(f"group {group} lists a rank out of range")
    return GroupProgress(group=group, ranks=ranks, entered_seq=m.entered_seq, entered_op=op,
                         completed_seq=m.completed_seq, entered_at=entered_at)


def activity_to_pb(a: Activity) -> pb.Activity:
    m = pb.Activity(window=a.window, main_cpu=a.main_cpu, process_cpu=a.process_cpu,
                    read_rate=a.read_rate, write_rate=a.write_rate, main_wait=a.main_wait)
    if a.gpu_util is not None:
        m.gpu_util = a.gpu_util
    return m


def activity_from_pb(m: pb.Activity) -> Activity:
    # Each field read once: a real agent sends an activity with every rank state.
    window, main, process, read, write, wait = (m.window, m.main_cpu, m.process_cpu,
                                                m.read_rate, m.write_rate, m.main_wait)
    gpu = m.gpu_util if m.HasField("gpu_util") else None
    values = (window, main, process, read, write, gpu or 0.0, wait)
    check_times(sum(values))
    if min(values) < 0:
        raise MessageRejectedError("a negative activity rate")
    if wait > 1:
        raise MessageRejectedError("a main thread that waited for a CPU more than all the time")
    if not window:
        return NO_ACTIVITY
    return Activity(window, main, process, read, write, gpu, wait)


def _frames_to_pb(frames: tuple[Frame, ...]) -> list[pb.Frame]:
    return [pb.Frame(function=f.function, file=f.file, line=f.line) for f in frames]


def _frames_from_pb(frames: Sequence[pb.Frame], limit: int) -> tuple[Frame, ...]:
    if len(frames) > limit:
        say_once("frames", "an agent sent a stack of %d frames: the innermost %d kept",
                 len(frames), limit - 1)
    # Only the frames kept are converted: a deep stack costs no more than a bounded one.
    return bounded_frames([Frame(f.function, f.file, f.line) for f in frames[:limit]], limit,
                          len(frames))


def _shared_frames(m: pb.RankStack) -> tuple[Frame, ...]:
    """A rank's frames, one tuple shared by the ranks whose stacks are equal: what the
    coordinator reads from a stack it reads once per distinct stack (`frames.by_identity`),
    not once per rank."""
    key = tuple([(f.function, f.file, f.line) for f in m.frames])
    shared = _SHARED.get(key)
    if shared is None:
        shared = _SHARED.put(key, _frames_from_pb(m.frames, MAX_FRAMES), m.ByteSize())
    return shared


# Keyed by what the agent sent, cut or not: a budget of its bytes, a few thousand stacks.
_SHARED: BoundedTable[tuple[tuple[str, str, int], ...], tuple[Frame, ...]] = BoundedTable(
    SHARED_BYTES)


def exit_reason_to_pb(e: ExitReason) -> pb.ExitReason:
    return pb.ExitReason(exception=e.exception, message=e.message,
                         frames=_frames_to_pb(e.frames), signal=e.signal,
                         oom_killed=e.oom_killed)


def exit_reason_from_pb(m: pb.ExitReason) -> ExitReason:
    exception, message = cut_texts(m.exception, m.message)
    if not SIGNAL.fullmatch(m.signal):
        raise MessageRejectedError(f"{m.signal[:40]!r} is not a signal name")
    return ExitReason(exception, message, _frames_from_pb(m.frames, MAX_REASON_FRAMES),
                      m.signal, m.oom_killed)


def rank_to_pb(r: RankState) -> pb.RankState:
    m = pb.RankState(
        job_id=r.job_id, rank=r.rank, local_rank=r.local_rank, world_size=r.world_size,
        host=r.host, pid=r.pid, hooked=r.hooked, proc_state=r.proc_state, steps=r.steps,
        events=r.events, last_event_at=r.last_event_at,
        groups=[group_to_pb(g) for g in r.groups], phase=r.phase, phase_age=r.phase_age,
        phase_timeout=r.phase_timeout, clean_exit=r.clean_exit, gap_p99=r.pace.gap_p99,
        gaps=r.pace.gaps, attempt=r.attempt, setup=r.setup, rendezvous=r.rendezvous)
    if r.exit_reason is not None:
        m.exit_reason.CopyFrom(exit_reason_to_pb(r.exit_reason))
    if r.setup_age is not None:
        m.setup_age = r.setup_age
    if r.heartbeat_age is not None:
        m.heartbeat_age = r.heartbeat_age
    if r.exited_at is not None:
        m.exited_at = r.exited_at
    if r.exit_code is not None:
        m.exit_code = r.exit_code
    if r.progress_age is not None:
        m.progress_age = r.progress_age
    if r.compile_age is not None:
        m.compile_age = r.compile_age
    m.waited, m.waited_sq = r.waited, r.waited_sq
    if r.activity.window:
        m.activity.CopyFrom(activity_to_pb(r.activity))
    if r.evidence is not NO_EVIDENCE:
        m.evidence.CopyFrom(evidence_to_pb(r.evidence))
    if r.environment is not None:
        m.environment.CopyFrom(environment_to_pb(r.environment))
    if r.uid is not None:
        m.uid = r.uid
    return m


def rank_from_pb(m: pb.RankState) -> RankState:
    job_id, host, proc_state, phase, setup, rendezvous = cut_texts(
        m.job_id, m.host, m.proc_state, m.phase, m.setup, m.rendezvous)
    rank, world, local_rank = m.rank, m.world_size, m.local_rank
    if not job_id:
        raise MessageRejectedError("rank state without a job id")
    if not 0 < world <= MAX_WORLD or not 0 <= rank < world or not -1 <= local_rank < MAX_RANK:
        raise MessageRejectedError(f"rank {rank} (local {local_rank}) of world size {world} "
                                   f"is impossible (at most {MAX_WORLD} ranks)")
    if m.attempt >= MAX_ATTEMPT:
        raise MessageRejectedError(f"attempt {m.attempt} is out of range")
    setup_age = m.setup_age if m.HasField("setup_age") else None
    heartbeat_age = m.heartbeat_age if m.HasField("heartbeat_age") else None
    exited_at = m.exited_at if m.HasField("exited_at") else None
    progress_age = m.progress_age if m.HasField("progress_age") else None
    compile_age = m.compile_age if m.HasField("compile_age") else None
    last_event_at, phase_age, phase_timeout = m.last_event_at, m.phase_age, m.phase_timeout
    gap_p99, gaps = m.gap_p99, m.gaps
    check_times(last_event_at + phase_age + phase_timeout + (heartbeat_age or 0.0)
                 + (exited_at or 0.0) + (progress_age or 0.0) + gap_p99 + (setup_age or 0.0)
                 + (compile_age or 0.0) + m.waited + m.waited_sq)
    if compile_age is not None and compile_age < 0:
        raise MessageRejectedError(f"compile age {compile_age} is negative")
    return RankState(
        job_id=job_id, rank=rank, local_rank=local_rank, world_size=world, host=host, pid=m.pid,
        hooked=m.hooked, proc_state=proc_state, heartbeat_age=heartbeat_age, steps=m.steps,
        events=m.events, last_event_at=last_event_at,
        groups=tuple([group_from_pb(g) for g in m.groups]), phase=phase, phase_age=phase_age,
        phase_timeout=phase_timeout, exited_at=exited_at,
        exit_code=m.exit_code if m.HasField("exit_code") else None, clean_exit=m.clean_exit,
        progress_age=progress_age, compile_age=compile_age,
        # most ranks report no pace yet: no record of their own
        pace=Pace(gap_p99=gap_p99, gaps=gaps) if gap_p99 or gaps else NO_PACE,
        activity=activity_from_pb(m.activity) if m.HasField("activity") else NO_ACTIVITY,
        exit_reason=exit_reason_from_pb(m.exit_reason) if m.HasField("exit_reason") else None,
        attempt=m.attempt, setup=setup, setup_age=setup_age, rendezvous=rendezvous,
        evidence=evidence_from_pb(m.evidence) if m.HasField("evidence") else NO_EVIDENCE,
        environment=environment_from_pb(m.environment) if m.HasField("environment") else None,
        waited=m.waited, waited_sq=m.waited_sq, uid=m.uid if m.HasField("uid") else None)


def report_to_pb(report: NodeReport) -> pb.AgentMessage:
    return pb.AgentMessage(report=pb.NodeReport(
        node=report.node, sent_at=report.sent_at, ranks=[rank_to_pb(r) for r in report.ranks]))


def stacks_to_pb(reply: StackReply) -> pb.AgentMessage:
    return pb.AgentMessage(stacks=pb.StackReply(
        request_id=reply.request_id, node=reply.node,
        stacks=[pb.RankStack(rank=s.rank, pid=s.pid, error=s.error, was_stopped=s.was_stopped,
                             frames=_frames_to_pb(s.frames), nccl_log=s.nccl_log,
                             worker_log=s.worker_log, samples=s.samples, moved=s.moved,
                             children=[_child_to_pb(c) for c in s.children])
                for s in reply.stacks]))


def _child_to_pb(c: ChildStack) -> pb.ChildStack:
    return pb.ChildStack(pid=c.pid, role=c.role,
                         worker_id=-1 if c.worker_id is None else c.worker_id, state=c.state,
                         frames=_frames_to_pb(c.frames), error=c.error, moved=c.moved, cpu=c.cpu)


def _child_from_pb(m: pb.ChildStack) -> ChildStack:
    if not 0 < m.pid < MAX_PID or not -1 <= m.worker_id < MAX_WORKER_ID:
        raise MessageRejectedError(f"child pid {m.pid} or worker id {m.worker_id} out of range")
    if m.role not in CHILD_ROLES or m.state not in PROC_STATES:
        raise MessageRejectedError(f"child role {m.role[:64]!r} or state {m.state[:8]!r} unknown")
    if not 0.0 <= m.cpu <= MAX_CHILD_CPU:  # NaN fails this too
        raise MessageRejectedError(f"child CPU {m.cpu} out of range")
    return ChildStack(pid=m.pid, role=m.role, worker_id=None if m.worker_id < 0 else m.worker_id,
                      state=m.state, frames=_frames_from_pb(m.frames, MAX_CHILD_FRAMES),
                      error=cut_text(m.error, "child error"), moved=m.moved, cpu=m.cpu)


def _log_lines(lines: Sequence[str], limit: int) -> tuple[str, ...]:
    """The last `limit` lines (a log's latest lines are the ones that tell), each bounded."""
    if len(lines) > limit:
        say_once("log lines", "an agent sent %d log lines of one rank: the last %d kept",
                 len(lines), limit)
    return tuple(cut_text(line, "log line") for line in lines[max(0, len(lines) - limit):])


def _stack_from_pb(m: pb.RankStack) -> RankStack:
    if len(m.children) > MAX_CHILDREN:
        raise MessageRejectedError(f"stack with {len(m.children)} children (at most "
                                   f"{MAX_CHILDREN})")
    frames = _shared_frames(m)
    nccl_log = _log_lines(m.nccl_log, MAX_LOG_LINES)
    return RankStack(rank=checked_rank(m.rank, "rank"), pid=m.pid, frames=frames,
                     error=cut_text(m.error, "stack error"), was_stopped=m.was_stopped,
                     nccl_log=nccl_log,
                     worker_log=_log_lines(m.worker_log, MAX_LOG_LINES - len(nccl_log)),
                     samples=min(max(m.samples, 1), MAX_SAMPLES), moved=m.moved,
                     children=tuple(_child_from_pb(c) for c in m.children))


def agent_message_from_pb(m: pb.AgentMessage) -> NodeReport | StackReply:
    body = m.WhichOneof("body")
    if body == "report":
        node = cut_text(m.report.node, "node")
        return NodeReport(node=node, sent_at=finite_time(m.report.sent_at, "sent_at"),
                          ranks=_each(rank_from_pb, m.report.ranks, node))
    if body == "stacks":
        node = cut_text(m.stacks.node, "node")
        return StackReply(request_id=m.stacks.request_id, node=node,
                          stacks=_each(_stack_from_pb, m.stacks.stacks, node))
    raise MessageRejectedError("empty agent message")


def _each(convert: Callable[[M], T], messages: Sequence[M], node: str) -> tuple[T, ...]:
    """Each message converted; one that is malformed is dropped alone, and said (once a
    reason): a rank's impossible state never costs its node the others'."""
    kept = []
    for message in messages:
        try:
            kept.append(convert(message))
        except MessageRejectedError as e:
            name = type(message).__name__
            say_once(name, "dropped a %s of node %s: %s", name, printable(node),
                     printable(str(e)))
    return tuple(kept)


def stack_request_to_pb(req: StackRequest) -> pb.CoordinatorMessage:
    return pb.CoordinatorMessage(stack_request=pb.StackRequest(
        request_id=req.request_id, job_id=req.job_id, ranks=req.ranks, samples=req.samples))


def coordinator_message_from_pb(m: pb.CoordinatorMessage) -> StackRequest | None:
    """The request an agent must serve, or None for a message kind it does not know."""
    if m.WhichOneof("body") != "stack_request":
        return None
    r = m.stack_request
    return StackRequest(request_id=r.request_id, job_id=cut_text(r.job_id, "job id"),
                        ranks=tuple(checked_rank(x, "rank") for x in r.ranks),
                        samples=min(max(r.samples, 1), MAX_SAMPLES))


def status_request_to_pb(query: StatusQuery) -> pb.StatusRequest:
    return pb.StatusRequest(job_id=query.job_id, ranks=",".join(map(str, query.ranks)))


def status_request_from_pb(m: pb.StatusRequest) -> StatusQuery:
    try:
        ranks = parse_ranks(cut_text(m.ranks, "ranks"), MAX_FULL_ROWS) if m.ranks else ()
    except ValueError as e:
        raise MessageRejectedError(f"ranks: {e}") from None
    return StatusQuery(cut_text(m.job_id, "job id"), ranks)


def status_reply_to_pb(status_json: str) -> pb.StatusReply:
    return pb.StatusReply(status_json=status_json)


def status_reply_from_pb(m: pb.StatusReply) -> str:
    return m.status_json
