"""The incident record: the JSON docs/design.md specifies (typed in `watchdog.schema`), built
from a snapshot and its verdict (runs in the coordinator). `rank_table` also feeds `watchdog
status --json`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from watchdog import schema
from watchdog.coordinator.alike import ranges
from watchdog.coordinator.evidence import dead_worker, finished_cleanly
from watchdog.coordinator.fit import fit_incident
from watchdog.coordinator.silent_bugs import Finding
from watchdog.coordinator.view import RankEvidence, rank_evidence
from watchdog.explain.scan import explain_lines
from watchdog.frames import FrameKey, frame_site, python_frames, stack_signature, top_frame
from watchdog.model import (
    DATALOADER_WORKER,
    FULL_ROWS,
    MAX_FULL_ROWS,
    ChildStack,
    ExitReason,
    Frame,
    GroupProgress,
    JobSnapshot,
    Kind,
    RankStack,
    RankState,
    RankStatus,
    Verdict,
)

TIMELINE_GROUPS = 8  # an incident row carries the last collective of at most this many groups


def build_incident(
    snapshot: JobSnapshot,
    verdict: Verdict,
    incident_id: str,
    detected_at: float,
) -> schema.Incident:
    """One incident, keys in docs/design.md's order."""
    collective = verdict.collective
    table = rank_table(snapshot, verdict.culprit_ranks)
    incident: schema.Incident = {
        "id": incident_id,
        "job_id": snapshot.job_id,
        "detected_at": detected_at,
        "kind": verdict.kind,
        "severity": verdict.severity,
        "summary": verdict.summary,
        "culprit_ranks": list(verdict.culprit_ranks),
        "waiting_ranks": list(verdict.waiting_ranks),
        "collective": None
        if collective is None
        else {
            "group": collective.group,
            "ranks": list(collective.ranks),
            "seq": collective.seq,
            "op": collective.op,
        },
        "advice": None if verdict.advice is None else {
            "category": verdict.advice.category, "cause": verdict.advice.cause,
            "fix": verdict.advice.fix,
        },
        "attempt": snapshot.attempt,
        "ranks": table["ranks"],
        "rank_groups": table["rank_groups"],
        "stack_groups": stack_groups(snapshot.stacks),
    }
    if verdict.kind == Kind.NODE_UNREACHABLE:
        incident["node"] = verdict.node
    return fit_incident(incident)


def build_finding_incident(snapshot: JobSnapshot, finding: Finding, incident_id: str,
                           detected_at: float) -> schema.Incident:
    """A finding's incident (severity warning): the keys of any incident, with no collective
    or stacks, and `finding`: the first step it was seen at, its cause and its fix."""
    table = rank_table(snapshot, finding.culprit_ranks)
    return fit_incident({
        "id": incident_id,
        "job_id": snapshot.job_id,
        "detected_at": detected_at,
        "kind": finding.kind,
        "severity": finding.kind.severity,
        "summary": finding.summary,
        "culprit_ranks": list(finding.culprit_ranks),
        "waiting_ranks": [],
        "collective": None,
        "ranks": table["ranks"],
        "rank_groups": table["rank_groups"],
        "stack_groups": [],
        "finding": {"key": finding.key, "step": finding.step, "cause": finding.cause,
                    "fix": finding.fix},
    })


def rank_table(snapshot: JobSnapshot, culprits: Collection[int] = (),
               wanted: Collection[int] = ()) -> schema.RankTable:
    """`ranks` and `rank_groups`, of an incident and of `watchdog status --json`. Up to
    FULL_ROWS ranks, every rank in full, by rank. Above, culprits, the ranks `wanted` (a reader
    asked) and ranks with evidence of their own (logs, children, an exit's reason) in full, up
    to MAX_FULL_ROWS, and each other rank in the group of those alike (`alike`), fewest first."""
    seen = rank_evidence(snapshot)
    if len(seen) <= FULL_ROWS:
        return {"ranks": [_rank_row(snapshot, s) for s in seen.values()], "rank_groups": []}
    numbers = _Numbers()
    likeness = {rank: _likeness(snapshot, evidence, numbers) for rank, evidence in seen.items()}
    blamed = set(culprits).union(wanted)
    own = [r for r in seen if r in blamed] + [r for r in seen if r not in blamed
                                                   and likeness[r] is None]
    full = sorted(own[:MAX_FULL_ROWS])
    listed = set(full)
    alike: dict[tuple[object, ...], list[RankEvidence]] = {}
    for rank, evidence in seen.items():
        if rank not in listed:  # a rank of its own past MAX_FULL_ROWS: a group of one
            alike.setdefault(likeness[rank] or (rank,), []).append(evidence)
    groups = sorted(alike.values(), key=lambda members: (len(members), members[0].state.rank))
    return {"ranks": [_rank_row(snapshot, seen[r]) for r in full],
            "rank_groups": [_group(snapshot, members) for members in groups]}


class _Numbers:
    """Stacks numbered by their `stack_signature`, equal ones alike. Ranks alike share one
    tuple of frames (see `wire._shared_frames`): each is read once, and a rank's likeness
    holds a number, not a stack to hash."""

    def __init__(self) -> None:
        self._by_object: dict[int, tuple[Sequence[Frame], int]] = {}
        self._by_value: dict[tuple[FrameKey, ...], int] = {}

    def of(self, frames: Sequence[Frame]) -> int:
        known = self._by_object.get(id(frames))
        if known is not None and known[0] is frames:
            return known[1]
        signature = stack_signature(python_frames(frames))
        number = self._by_value.setdefault(signature, len(self._by_value))
        self._by_object[id(frames)] = frames, number
        return number


def _likeness(snapshot: JobSnapshot, seen: RankEvidence,
              numbers: _Numbers) -> tuple[object, ...] | None:
    """What ranks alike share (state, step, last collective, set-up, phase, exit code, stack);
    None for a rank with evidence of its own, which a group would lose."""
    rank, stack = seen.state, seen.stack
    if rank.exit_reason is not None or (stack is not None and (
            stack.nccl_log or stack.worker_log or stack.children)):
        return None
    last = _last_entered(rank)
    return (_rank_state(snapshot, seen), rank.steps, None if last is None else (
        last.group, last.entered_seq, last.entered_op, last.pending), rank.setup, rank.phase,
        rank.exit_code, numbers.of(seen.frames))


def _group(snapshot: JobSnapshot, members: Sequence[RankEvidence]) -> schema.RankGroup:
    """Ranks alike: their ranges and what they share, as the first of them shows it."""
    first = members[0]
    rank = first.state
    return {
        "ranks": ranges(m.state.rank for m in members),
        "count": len(members),
        "state": _rank_state(snapshot, first),
        "step": rank.steps,
        "last_collective": _last_collective(rank),
        "setup": rank.setup or None,
        "phase": rank.phase,
        "exit_code": rank.exit_code,
        "stack": _frames_json(first.frames),
        "hosts": len({m.state.host for m in members}),
    }


def _rank_state(snapshot: JobSnapshot, seen: RankEvidence) -> RankStatus:
    if not seen.state.alive:
        return RankStatus.FINISHED if finished_cleanly(seen.state) else RankStatus.EXITED
    if seen.stopped:
        return RankStatus.STOPPED
    if seen.wedged:
        return RankStatus.WEDGED
    if seen.waiting:
        return RankStatus.WAITING
    if not snapshot.stalled:
        return RankStatus.RUNNING
    return RankStatus.BUSY if seen.progress else RankStatus.STALLED


def stack_groups(stacks: Mapping[int, RankStack]) -> list[schema.StackGroup]:
    """Ranks with the same main-thread stack, fewest first (the odd one out is the suspect).

    Library frames are compared without their line numbers: ranks waiting in one collective may
    sit on different lines of its polling loop. The user's own lines must match.
    """
    groups: dict[int, list[RankStack]] = {}
    numbers = _Numbers()
    for rank in sorted(stacks):
        stack = stacks[rank]
        if stack.frames:
            groups.setdefault(numbers.of(stack.frames), []).append(stack)
    ordered = sorted(groups.values(), key=lambda members: (len(members), members[0].rank))
    return [
        {"ranks": [s.rank for s in members], "top": _frame_text(members[0])} for members in ordered
    ]


def _rank_row(snapshot: JobSnapshot, seen: RankEvidence) -> schema.RankRow:
    rank = seen.state
    stack = seen.stack or RankStack(rank.rank, rank.pid)
    return {
        "rank": rank.rank,
        "host": rank.host,
        "node": snapshot.rank_nodes.get(rank.rank, rank.host),
        "pid": rank.pid,
        "state": _rank_state(snapshot, seen),
        "step": rank.steps,
        "last_collective": _last_collective(rank),
        "setup": rank.setup or None,
        "stack": _frames_json(stack.frames),
        "children": [_child_row(child) for child in stack.children] + _dead_children(rank),
        "nccl_log": list(stack.nccl_log),
        "nccl_findings": _findings(stack.nccl_log),
        "worker_log": list(stack.worker_log),
        "worker_findings": _findings(stack.worker_log),
        "exit_code": rank.exit_code,
        "exit_reason": _exit_reason(rank.exit_reason),
        "heartbeat_age": rank.heartbeat_age,
        "phase": rank.phase,
        "activity": _activity(rank),
        "timeline": _timeline(rank),
    }


def _child_row(child: ChildStack) -> schema.Child:
    """A child process the rank waits on, as docs/design.md's incident carries it."""
    return {"pid": child.pid, "role": child.role or None, "worker_id": child.worker_id,
            "state": child.state, "stack": _frames_json(child.frames), "error": child.error,
            "moved": child.moved, "cpu": child.cpu, "exit_code": None, "exit_reason": None}


def _dead_children(rank: RankState) -> list[schema.Child]:
    """The DataLoader worker whose death the rank's exception tells of, as a child row."""
    dead = dead_worker(rank.exit_reason)
    if dead is None:
        return []
    reason: schema.ExitReason | None = None
    if dead.signal:
        reason = {"signal": dead.signal, **({"oom_killed": True} if dead.oom_killed else {})}
    return [{"pid": dead.pid, "role": DATALOADER_WORKER, "worker_id": None, "state": "",
             "stack": [], "error": "", "moved": False, "cpu": 0.0, "exit_code": dead.exit_code,
             "exit_reason": reason}]


def _frames_json(frames: Sequence[Frame]) -> list[schema.Frame]:
    return [{"function": f.function, "file": f.file, "line": f.line} for f in frames]


def _exit_reason(reason: ExitReason | None) -> schema.ExitReason | None:
    """{"exception": {"type", "message", "frames"}} or {"signal": "SIGKILL"}; None: unknown."""
    if reason is None:
        return None
    if reason.exception:
        return {"exception": {"type": reason.exception, "message": reason.message,
                              "frames": _frames_json(reason.frames)}}
    killed: schema.ExitReason = {"signal": reason.signal}
    if reason.oom_killed:
        killed["oom_killed"] = True
    return killed


def _activity(rank: RankState) -> schema.Activity | None:
    """The /proc (and NVML) evidence behind BUSY and STALLED; None where none was measured."""
    work = rank.activity
    if not work.window:
        return None
    return {"window": round(work.window, 2), "main_cpu": round(work.main_cpu, 3),
            "process_cpu": round(work.process_cpu, 3), "read_rate": round(work.read_rate),
            "write_rate": round(work.write_rate), "gpu_util": work.gpu_util,
            "main_wait": round(work.main_wait, 3)}


def _findings(lines: Sequence[str]) -> list[schema.LogFinding]:
    return [finding.to_json() for finding in explain_lines(lines)] if lines else []


def _last_entered(rank: RankState) -> GroupProgress | None:
    groups = rank.groups
    if len(groups) <= 1:  # most ranks of a large job: the world group alone
        return groups[0] if groups else None
    return max(groups, key=lambda progress: progress.entered_at)


def _last_collective(rank: RankState) -> schema.LastCollective | None:
    last = _last_entered(rank)
    if last is None:
        return None
    return {
        "group": last.group,
        "seq": last.entered_seq,
        "op": last.entered_op,
        "completed": not last.pending,
    }


def _timeline(rank: RankState) -> schema.Timeline:
    """When this rank last did things, for the HTML report's timeline: its last event, its exit
    and the last collective of each of its groups (the TIMELINE_GROUPS entered last), with
    times. The beacon keeps no older history, so neither does the incident."""
    latest = sorted(rank.groups, key=lambda progress: progress.entered_at, reverse=True)
    return {
        "last_event_at": rank.last_event_at or None,
        "exited_at": rank.exited_at,
        "collectives": [
            {"group": p.group, "seq": p.entered_seq, "op": p.entered_op,
             "completed": not p.pending, "entered_at": p.entered_at}
            for p in latest[:TIMELINE_GROUPS]
        ],
    }


def _frame_text(stack: RankStack) -> str:
    """'all_reduce (distributed_c10d.py:2950)': the innermost Python frame, not the hook's."""
    frame = top_frame(stack.frames)
    return "" if frame is None else f"{frame.function} ({frame_site(frame)})"
