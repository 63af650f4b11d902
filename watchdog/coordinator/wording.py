"""The phrases several verdict rules share: where ranks wait, where they are stuck, which group
(coordinator process). Each rule builds its own sentence from them, next to its decision."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from watchdog.coordinator.evidence import child_name, collective_frame, stuck_child
from watchdog.coordinator.view import Place, StallView
from watchdog.frames import frame_site
from watchdog.model import DDP_INIT_OP, WORLD_GROUP, CollectiveRef
from watchdog.text import clock, ranks_text

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
        frame = job.alive[rank].stuck
        if frame is not None:
            whose = "" if len(ranks) == 1 else f"rank {rank} "
            child = stuck_child(job.alive[rank].stack)
            if child is not None:
                whose, frame = f"{whose}waits for {child_name(child[0])}, ", child[1]
            return f"{ranks_text(ranks)} ({whose}stuck in {frame.function} at {frame_site(frame)})"
    return ranks_text(ranks)


def waiters_text(job: StallView, ranks: Iterable[int]) -> str:
    """'ranks 0,2,3 wait in all_reduce #58 on group 0 (world) since 12:00:03; rank 1 waits ...'"""
    places: dict[Place | None, list[int]] = {}
    for rank in ranks:
        places.setdefault(job.place_of(rank), []).append(rank)
    return "; ".join(_wait_text(job, None if place is None else job.ref_at(place), waiters)
                     for place, waiters in places.items())


def _wait_text(job: StallView, place: CollectiveRef | None, ranks: list[int]) -> str:
    waits = f"{ranks_text(ranks)} {verb(ranks, 'waits')}"
    if place is None:
        return f"{waits} in a collective ({stack_place_text(job, ranks[0])})"
    entered = [job.alive[r].state.group(place.group) for r in ranks]
    since = min(progress.entered_at for progress in entered if progress is not None)
    return f"{waits} in {collective_text(place)} since {clock(since)}"


def stack_place_text(job: StallView, rank: int) -> str:
    seen = job.alive[rank]
    inside, caller = collective_frame(seen.frames), seen.stuck
    if inside is None or caller is None:
        return "no stack"
    return f"{inside.function} called at {frame_site(caller)}"


def verb(ranks: Sequence[int], singular: str) -> str:
    plural = {"waits": "wait", "is": "are", "works": "work"}[singular]
    return singular if len(ranks) == 1 else plural
