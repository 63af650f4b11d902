"""The one adapter between protobuf messages and `_model` dataclasses (agent and coordinator).

Every message that arrives is validated here: a malformed one raises MessageRejectedError and
never reaches the rest of the code.
"""

from __future__ import annotations

import math

from watchdog._errors import MessageRejectedError
from watchdog._model import (
    Frame,
    GroupProgress,
    NodeReport,
    RankStack,
    RankState,
    StackReply,
    StackRequest,
)
from watchdog._proto import watchdog_pb2 as pb

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_TEXT = 4096
MAX_RANK = 1 << 20
MAX_FRAMES = 512
MAX_LOG_LINES = 200


def _text(value: str, what: str) -> str:
    if len(value) > MAX_TEXT:
        raise MessageRejectedError(f"{what} is {len(value)} characters (at most {MAX_TEXT})")
    return value


def _rank(value: int, what: str) -> int:
    if not -1 <= value < MAX_RANK:
        raise MessageRejectedError(f"{what} {value} is out of range")
    return value


def _time(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise MessageRejectedError(f"{what} is not a finite number")
    return value


def group_to_pb(g: GroupProgress) -> pb.GroupProgress:
    return pb.GroupProgress(group=g.group, ranks=g.ranks, entered_seq=g.entered_seq,
                            entered_op=g.entered_op, completed_seq=g.completed_seq,
                            entered_at=g.entered_at)


def group_from_pb(m: pb.GroupProgress) -> GroupProgress:
    return GroupProgress(
        group=_text(m.group, "group name"),
        ranks=tuple(_rank(r, "group member") for r in m.ranks),
        entered_seq=m.entered_seq, entered_op=_text(m.entered_op, "op"),
        completed_seq=m.completed_seq, entered_at=_time(m.entered_at, "entered_at"))


def rank_to_pb(r: RankState) -> pb.RankState:
    m = pb.RankState(
        job_id=r.job_id, rank=r.rank, local_rank=r.local_rank, world_size=r.world_size,
        host=r.host, pid=r.pid, hooked=r.hooked, proc_state=r.proc_state, steps=r.steps,
        events=r.events, last_event_at=r.last_event_at,
        groups=[group_to_pb(g) for g in r.groups], phase=r.phase, phase_age=r.phase_age,
        phase_timeout=r.phase_timeout, clean_exit=r.clean_exit)
    if r.heartbeat_age is not None:
        m.heartbeat_age = r.heartbeat_age
    if r.exited_at is not None:
        m.exited_at = r.exited_at
    if r.exit_code is not None:
        m.exit_code = r.exit_code
    return m


def rank_from_pb(m: pb.RankState) -> RankState:
    if not m.job_id:
        raise MessageRejectedError("rank state without a job id")
    if not 0 < m.world_size <= MAX_RANK or not 0 <= m.rank < m.world_size:
        raise MessageRejectedError(f"rank {m.rank} of world size {m.world_size} is impossible")
    return RankState(
        job_id=_text(m.job_id, "job id"), rank=m.rank, local_rank=_rank(m.local_rank, "local rank"),
        world_size=m.world_size, host=_text(m.host, "host"), pid=m.pid, hooked=m.hooked,
        proc_state=_text(m.proc_state, "process state"),
        heartbeat_age=m.heartbeat_age if m.HasField("heartbeat_age") else None,
        steps=m.steps, events=m.events, last_event_at=_time(m.last_event_at, "last_event_at"),
        groups=tuple(group_from_pb(g) for g in m.groups), phase=_text(m.phase, "phase"),
        phase_age=_time(m.phase_age, "phase_age"),
        phase_timeout=_time(m.phase_timeout, "phase_timeout"),
        exited_at=_time(m.exited_at, "exited_at") if m.HasField("exited_at") else None,
        exit_code=m.exit_code if m.HasField("exit_code") else None, clean_exit=m.clean_exit)


def report_to_pb(report: NodeReport) -> pb.AgentMessage:
    return pb.AgentMessage(report=pb.NodeReport(
        node=report.node, sent_at=report.sent_at, ranks=[rank_to_pb(r) for r in report.ranks]))


def stacks_to_pb(reply: StackReply) -> pb.AgentMessage:
    return pb.AgentMessage(stacks=pb.StackReply(
        request_id=reply.request_id, node=reply.node,
        stacks=[pb.RankStack(rank=s.rank, pid=s.pid, error=s.error, was_stopped=s.was_stopped,
                             frames=[pb.Frame(function=f.function, file=f.file, line=f.line)
                                     for f in s.frames], nccl_log=s.nccl_log)
                for s in reply.stacks]))


def _stack_from_pb(m: pb.RankStack) -> RankStack:
    if len(m.frames) > MAX_FRAMES or len(m.nccl_log) > MAX_LOG_LINES:
        raise MessageRejectedError(f"stack of {len(m.frames)} frames and {len(m.nccl_log)} log "
                                   f"lines (at most {MAX_FRAMES} and {MAX_LOG_LINES})")
    frames = tuple(Frame(_text(f.function, "function"), _text(f.file, "file"), f.line)
                   for f in m.frames)
    return RankStack(rank=_rank(m.rank, "rank"), pid=m.pid, frames=frames,
                     error=_text(m.error, "stack error"), was_stopped=m.was_stopped,
                     nccl_log=tuple(_text(line, "log line") for line in m.nccl_log))


def agent_message_from_pb(m: pb.AgentMessage) -> NodeReport | StackReply:
    body = m.WhichOneof("body")
    if body == "report":
        return NodeReport(node=_text(m.report.node, "node"),
                          sent_at=_time(m.report.sent_at, "sent_at"),
                          ranks=tuple(rank_from_pb(r) for r in m.report.ranks))
    if body == "stacks":
        return StackReply(request_id=m.stacks.request_id, node=_text(m.stacks.node, "node"),
                          stacks=tuple(_stack_from_pb(s) for s in m.stacks.stacks))
    raise MessageRejectedError("empty agent message")


def stack_request_to_pb(req: StackRequest) -> pb.CoordinatorMessage:
    return pb.CoordinatorMessage(stack_request=pb.StackRequest(
        request_id=req.request_id, job_id=req.job_id, ranks=req.ranks))


def coordinator_message_from_pb(m: pb.CoordinatorMessage) -> StackRequest | None:
    """The request an agent must serve, or None for a message kind it does not know."""
    if m.WhichOneof("body") != "stack_request":
        return None
    r = m.stack_request
    return StackRequest(request_id=r.request_id, job_id=_text(r.job_id, "job id"),
                        ranks=tuple(_rank(x, "rank") for x in r.ranks))


def status_request_to_pb(job_id: str) -> pb.StatusRequest:
    return pb.StatusRequest(job_id=job_id)


def status_request_from_pb(m: pb.StatusRequest) -> str:
    return _text(m.job_id, "job id")


def status_reply_to_pb(status_json: str) -> pb.StatusReply:
    return pb.StatusReply(status_json=status_json)


def status_reply_from_pb(m: pb.StatusReply) -> str:
    return m.status_json
