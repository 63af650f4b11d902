"""The verdict's sentences: where ranks wait, where they are stuck (coordinator process)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from watchdog.coordinator.evidence import (
    DeadWorker,
    StallView,
    child_name,
    collective_frame,
    dead_worker,
    frame_site,
    stuck_child,
    stuck_frame,
)
from watchdog.explain.scan import classify_line
from watchdog.model import DDP_INIT_OP, WORLD_GROUP, Advice, CollectiveRef, ExitReason, RankState
from watchdog.text import clock, ranks_text

MESSAGE_CHARS = 200  # of an exception's message in a summary: its first line, cut here
# What a collective the hook names after no torch function is, in a user's words
_OP_MEANINGS = {DDP_INIT_OP: "DDP's initial parameter broadcast"}


def group_text(group: str, members: Sequence[int]) -> str:
    """'group 0 (world)', 'group 1 (ranks 0,1)'."""
    if group == WORLD_GROUP:
        return f"group {group} (world)"
    return f"group {group} ({ranks_text(members)})" if members else f"group {group}"


def collective_text(ref: CollectiveRef) -> str:
    """'all_reduce #57 on group 0 (world)'; "DDP's initial parameter broadcast (ddp_init #1 on
    group 0 (world))"."""
    text = f"{ref.op} #{ref.seq} on {group_text(ref.group, ref.ranks)}"
    meaning = _OP_MEANINGS.get(ref.op)
    return f"{meaning} ({text})" if meaning else text


def culprits_text(job: StallView, ranks: Sequence[int]) -> str:
    """'rank 1 (stuck in __getitem__ at train.py:42)': where the first rank with a stack is;
    'rank 3 (waits for its DataLoader worker 1 (pid 4242), stuck in read_shard at data.py:16)'
    where that rank waits on a child that is stuck."""
    for rank in ranks:
        frame = stuck_frame(job.frames(rank))
        if frame is not None:
            whose = "" if len(ranks) == 1 else f"rank {rank} "
            child = stuck_child(job.snapshot.stacks.get(rank))
            if child is not None:
                whose, frame = f"{whose}waits for {child_name(child[0])}, ", child[1]
            return f"{ranks_text(ranks)} ({whose}stuck in {frame.function} at {frame_site(frame)})"
    return ranks_text(ranks)


def busy_text(job: StallView, busy: Mapping[int, str]) -> str:
    """'rank 0 busy in save_checkpoint at train.py:58 for 25 s, writing 41.9 MB/s': where the
    first busy rank with a stack works, and what shows it works."""
    ranks = list(busy)
    first = next((r for r in ranks if stuck_frame(job.frames(r)) is not None), ranks[0])
    frame = stuck_frame(job.frames(first))
    where = "" if frame is None else f" in {frame.function} at {frame_site(frame)}"
    whose = "" if len(ranks) == 1 else f"; rank {first}"
    return (f"{ranks_text(ranks)} busy{where if len(ranks) == 1 else ''} for "
            f"{job.snapshot.stalled_for:.0f} s{whose}{where if len(ranks) > 1 else ''}, "
            f"{busy[first]}")


def waiters_text(job: StallView, ranks: Iterable[int]) -> str:
    """'ranks 0,2,3 wait in all_reduce #58 on group 0 (world) since 12:00:03; rank 1 waits ...'"""
    places: dict[CollectiveRef | None, list[int]] = {}
    for rank in ranks:
        places.setdefault(job.waiting_in(rank), []).append(rank)
    return "; ".join(_wait_text(job, place, waiters) for place, waiters in places.items())


def _wait_text(job: StallView, place: CollectiveRef | None, ranks: list[int]) -> str:
    waits = f"{ranks_text(ranks)} {verb(ranks, 'waits')}"
    if place is None:
        return f"{waits} in a collective ({stack_place_text(job, ranks[0])})"
    entered = [job.alive[r].group(place.group) for r in ranks]
    since = min(progress.entered_at for progress in entered if progress is not None)
    return f"{waits} in {collective_text(place)} since {clock(since)}"


def stack_place_text(job: StallView, rank: int) -> str:
    frames = job.frames(rank)
    inside, caller = collective_frame(frames), stuck_frame(frames)
    if inside is None or caller is None:
        return "no stack"
    return f"{inside.function} called at {frame_site(caller)}"


def verb(ranks: Sequence[int], singular: str) -> str:
    plural = {"waits": "wait", "is": "are"}[singular]
    return singular if len(ranks) == 1 else plural


def exit_text(rank: RankState) -> str:
    """How a rank left: 'rank 1 raised RuntimeError: shard 7 is corrupt at train.py:88 and
    exited first at 12:00:03 (exit code 1, no clean shutdown)', 'rank 2 was killed by SIGKILL
    (the kernel's OOM killer) at 12:00:03, the first to exit,' or, without a known reason,
    'rank 3 exited first at 12:00:03 (exit code 0, clean shutdown)'."""
    reason, at = rank.exit_reason, clock(rank.exited_at or 0.0)
    code = "killed/unknown exit code" if rank.exit_code is None else f"exit code {rank.exit_code}"
    how = f"({code}, {'clean shutdown' if rank.clean_exit else 'no clean shutdown'})"
    dead = dead_worker(reason)
    if reason is not None and dead is not None:
        frame = stuck_frame(reason.frames)
        where = f" at {frame_site(frame)}" if frame is not None else ""
        return (f"rank {rank.rank}'s {dead_worker_text(dead)}; rank {rank.rank} raised "
                f"{reason.exception}{where} and exited first at {at} {how}")
    if reason is not None and reason.exception:
        return f"rank {rank.rank} raised {raised_text(reason)} and exited first at {at} {how}"
    if reason is not None and reason.signal:
        killer = " (the kernel's OOM killer)" if reason.oom_killed else ""
        return f"rank {rank.rank} was killed by {reason.signal}{killer} at {at}, the first to exit,"
    return f"rank {rank.rank} exited first at {at} {how}"


def all_raised_text(reason: ExitReason, ranks: Sequence[int], world_size: int) -> str:
    """Ranks that raised the same exception at the same place: 'all 4 ranks raised ValueError:
    sampler option is mutually exclusive with shuffle at train.py:262: a bug in the code, not a
    rank to blame', or 'ranks 1-3 all raised ...' when some rank of the job did not."""
    who = f"all {len(ranks)} ranks" if len(ranks) >= world_size else f"{ranks_text(ranks)} all"
    return f"{who} raised {raised_text(reason)}: a bug in the code, not a rank to blame"


def raised_text(reason: ExitReason) -> str:
    """'RuntimeError: shard 7 is corrupt at train.py:88': the type, the message's first line
    (cut at MESSAGE_CHARS) and the innermost frame of the user's own code."""
    message = reason.message.strip().split("\n", 1)[0]
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    frame = stuck_frame(reason.frames)
    where = f" at {frame_site(frame)}" if frame is not None else ""
    return f"{reason.exception}: {message}{where}"


def dead_worker_text(dead: DeadWorker) -> str:
    """'DataLoader worker (pid 4242) was killed by SIGKILL (the kernel's OOM killer)',
    'DataLoader worker (pid 4242) died (exit code 1)'. The OOM killer is named where the rank's
    memory cgroup counted a kill while it ran."""
    if dead.signal:
        killer = " (the kernel's OOM killer)" if dead.oom_killed else ""
        return f"DataLoader worker (pid {dead.pid}) was killed by {dead.signal}{killer}"
    code = "" if dead.exit_code is None else f" (exit code {dead.exit_code})"
    oom = ", the kernel's OOM killer killed a process of its memory cgroup" if (
        dead.oom_killed) else ""
    return f"DataLoader worker (pid {dead.pid}) died{code}{oom}"


def exit_advice(rank: RankState) -> Advice | None:
    """What `watchdog explain` says of the exception the rank raised, if it knows it."""
    reason = rank.exit_reason
    if reason is None or not reason.exception:
        return None
    finding = classify_line(0, f"{reason.exception}: {reason.message}"[:4096])
    return None if finding is None else Advice(finding.category, finding.cause, finding.fix)
