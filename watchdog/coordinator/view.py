"""A job's evidence at one instant, read once (runs in the coordinator): one record per rank
whose answers (waiting? working? wedged?) are each computed once per snapshot, and for a
stalled job each group's frontier. The verdict's rules and the incident's table ask these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Generic, TypeVar, overload

from watchdog.coordinator.evidence import (
    collective_frame,
    in_open_phase,
    is_stopped,
    latest_pending,
    progress_sign,
    waits_for_file_lock,
    waits_in_collective,
    wedge_reason,
)
from watchdog.coordinator.membership import furthest_entered, group_members
from watchdog.coordinator.startup import setup_call
from watchdog.frames import stuck_frame
from watchdog.model import (
    CollectiveRef,
    Frame,
    GroupProgress,
    JobSnapshot,
    RankStack,
    RankState,
)

T = TypeVar("T")
Place = tuple[str, int, str]  # a collective as (group, seq, op)


class cached_property(Generic[T]):
    """functools.cached_property without its lock: Python 3.11's takes one on each first use,
    which a verdict on 131,072 ranks pays hundreds of thousands of times. The coordinator asks
    from one thread."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self._compute = compute
        self._name = compute.__name__
        self.__doc__ = compute.__doc__

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> cached_property[T]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any]) -> T: ...

    def __get__(self, instance: object | None, owner: type[Any]) -> T | cached_property[T]:
        if instance is None:
            return self
        # Kept in the instance's __dict__, which then answers before this descriptor does.
        value: T = instance.__dict__.setdefault(self._name, self._compute(instance))
        return value


class RankEvidence:
    """What one rank's state and stacks say at one snapshot. What every verdict asks of every
    rank (stopped? wedged? waiting? in a set-up call?) is answered at once; the rest on first
    use, and kept: a verdict asks the same rank the same questions from several rules."""

    def __init__(self, state: RankState, stack: RankStack | None, stalled_for: float,
                 furthest: Mapping[str, int]) -> None:
        self.state = state
        self.stack = stack
        self.stalled_for = stalled_for  # the job's, for the rates that count (`progress_sign`)
        self.furthest = furthest  # per group, the furthest collective entered (`furthest_entered`)
        self.stopped = is_stopped(state, stack)
        # Why it cannot be making progress (see `wedge_reason`), or ''.
        self.wedged = wedge_reason(state, self.stopped, lambda: self.progress)
        # Whether it waits in a collective (see `waits_in_collective`).
        self.waiting = waits_in_collective(state, stack, furthest)
        # The set-up call it waits in, or '' (see `startup.setup_call`).
        self.setup = setup_call(state, stack)

    @property
    def frames(self) -> Sequence[Frame]:
        return self.stack.frames if self.stack is not None else ()

    @cached_property
    def progress(self) -> str:
        """What shows that the rank works (see `progress_sign`), or ''."""
        return progress_sign(self.state, self.stack, self.stalled_for)

    @cached_property
    def stack_waiting(self) -> bool | None:
        """Whether its stack sits in a collective; None without a stack."""
        return collective_frame(self.frames) is not None if self.frames else None

    @cached_property
    def lock_wait(self) -> bool:
        """Whether its stack waits to take a file lock (see `waits_for_file_lock`)."""
        return waits_for_file_lock(self.frames)

    @cached_property
    def in_phase(self) -> bool:
        return in_open_phase(self.state)

    @property
    def blameable(self) -> bool:
        """Neither waiting in a collective nor inside a phase that still has time left."""
        return not self.waiting and not self.in_phase

    @cached_property
    def stuck(self) -> Frame | None:
        """The innermost frame of the user's own code in its stack (see `stuck_frame`)."""
        return stuck_frame(self.frames)

    @cached_property
    def pending(self) -> GroupProgress | None:
        """Where it waits by its hook (see `latest_pending`)."""
        return latest_pending(self.state)


def rank_evidence(snapshot: JobSnapshot) -> dict[int, RankEvidence]:
    """Every rank's record, by rank: made once per snapshot."""
    made: dict[int, RankEvidence] | None = snapshot.derived.get("rank_evidence")
    if made is None:
        furthest = furthest_entered(snapshot)
        stacks, stalled_for = snapshot.stacks, snapshot.stalled_for
        made = snapshot.derived["rank_evidence"] = {
            rank.rank: RankEvidence(rank, stacks.get(rank.rank), stalled_for, furthest)
            for rank in sorted(snapshot.ranks, key=attrgetter("rank"))}
    return made


@dataclass(frozen=True)
class Frontier:
    """The furthest collective any live member of one group entered, and who is there or behind."""

    group: str
    members: tuple[int, ...]
    seq: int
    arrived: Mapping[int, GroupProgress]
    behind: tuple[int, ...]

    @cached_property
    def waiters(self) -> tuple[int, ...]:
        return tuple(rank for rank, progress in self.arrived.items() if progress.pending)

    @property
    def all_waiting(self) -> bool:
        return len(self.waiters) == len(self.arrived)

    @cached_property
    def by_op(self) -> dict[str, list[int]]:
        """The ranks arrived, by the op each entered there."""
        by_op: dict[str, list[int]] = {}
        for rank, progress in self.arrived.items():
            by_op.setdefault(progress.entered_op, []).append(rank)
        return by_op

    def ref(self, op: str) -> CollectiveRef:
        return CollectiveRef(self.group, self.members, self.seq, op)

    def since(self, ranks: Iterable[int]) -> float:
        return min(self.arrived[rank].entered_at for rank in ranks)


@dataclass(frozen=True)
class StallView:
    """The live ranks of a stalled job, each read once, and each group's frontier."""

    snapshot: JobSnapshot
    alive: Mapping[int, RankEvidence]
    members: Mapping[str, tuple[int, ...]]  # of every group a live rank is in
    frontiers: tuple[Frontier, ...]

    @classmethod
    def of(cls, snapshot: JobSnapshot) -> StallView:
        alive = {r: seen for r, seen in rank_evidence(snapshot).items() if seen.state.alive}
        names = sorted({p.group for seen in alive.values() for p in seen.state.groups})
        members = {name: group_members(snapshot, name) for name in names}
        frontiers = (_frontier(alive, name, members[name]) for name in names)
        return cls(snapshot, alive, members, tuple(f for f in frontiers if f is not None))

    @property
    def stack_only(self) -> bool:
        return not any(seen.state.groups for seen in self.alive.values())

    @cached_property
    def missing_frontiers(self) -> tuple[Frontier, ...]:
        """The frontiers that some members wait at and others never reached."""
        return tuple(f for f in self.frontiers if f.behind and f.waiters)

    def waiters(self, excluding: Iterable[int] = ()) -> tuple[int, ...]:
        skip = set(excluding)
        return tuple(r for r, seen in self.alive.items() if r not in skip and seen.waiting)

    def waits_with_others(self, rank: int) -> bool:
        """Pending in a collective that other ranks wait in too: a stale heartbeat or D state
        there is the wait itself, not its cause. A stopped process is never merely waiting."""
        seen = self.alive[rank]
        if seen.stopped:
            return False
        return any(
            (same := peer.state.group(progress.group)) is not None
            and same.pending
            and same.entered_seq == progress.entered_seq
            for progress in seen.state.groups
            if progress.pending
            for peer in self.alive.values()
            if peer.state.rank != rank
        )

    def place_of(self, rank: int) -> Place | None:
        """Where it waits by its hook, as (group, seq, op): ranks are sorted by place with this,
        not with a CollectiveRef, whose hash walks every member of the group."""
        progress = self.alive[rank].pending
        return None if progress is None else (progress.group, progress.entered_seq,
                                              progress.entered_op)

    def ref_at(self, place: Place) -> CollectiveRef:
        group, seq, op = place
        return CollectiveRef(group, self.members[group], seq, op)


def _frontier(alive: Mapping[int, RankEvidence], name: str,
              members: tuple[int, ...]) -> Frontier | None:
    reached = {r: alive[r].state.group(name) for r in members
               if r in alive and alive[r].state.hooked}
    seq = max((p.entered_seq for p in reached.values() if p is not None), default=0)
    if seq == 0:
        return None
    arrived = {r: p for r, p in reached.items() if p is not None and p.entered_seq == seq}
    behind = tuple(r for r, p in reached.items() if p is None or p.entered_seq < seq)
    return Frontier(name, members, seq, arrived, behind)
