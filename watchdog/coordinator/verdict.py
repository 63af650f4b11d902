"""Verdict engine: names the rank that hung a job, and why (runs in the coordinator).

`decide` is a pure function of one JobSnapshot. RANK_EXITED is decided at any time; the other
kinds only once the job is stalled, tried in docs/design.md's priority order (ranks stuck in
init_process_group or new_group: `startup`), and then tiered:
a culprit that shows progress is busy (RANK_BUSY, a notice) until the busy timeout. Group reasoning
compares sequence numbers, which every member of a process group counts identically; ranks that
report no group (no hook, or before init_process_group returns) are judged by their stacks
alone.

Beyond docs/design.md's table:
- A stopped process (state T) is RANK_WEDGED even inside a collective its peers wait in; a stale
  heartbeat or D state there is only the wait itself.
- Ranks that wait in different collectives, each for the other side (rank 0 in its pair's
  collective, ranks 1-3 in the world's), are a COLLECTIVE_MISMATCH across groups.
- DDP's all-reduce counts as entered at forward: a rank whose stack is outside any collective
  while its peers' stacks wait never reached it (MISSING_RANKS, not ALL_IN_COLLECTIVE).
- Ranks that raised the same exception type at the same place of the user's code are one bug,
  blamed together (RANK_EXITED "all 4 ranks raised ..."); an exception that says a peer went
  away (explain's PEER_EXITED) is never grouped: every victim of one death raises it alike.

Ties, so that one snapshot always gives one verdict:
- COLLECTIVE_MISMATCH blames every side but the largest; between equal sides, the side holding
  the lowest rank is blamed, since rank-0-only branches are where stray collectives usually live.
- A rank waits where it entered last (its pending collective with the latest `entered_at`).
- Of the groups that show a culprit missing, the summary names the one whose missing members are
  all culprits, then the one with the most waiters, then the lowest group name.
- waiting_ranks are the ranks blocked in a collective (pending, or stack in one), culprits aside.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from watchdog.coordinator.evidence import (
    Frontier,
    StallView,
    awaited_collective,
    finished_cleanly,
    in_open_phase,
    latest_pending,
    stuck_frame,
    wedge_reason,
)
from watchdog.coordinator.startup import setup_stall
from watchdog.coordinator.wording import (
    all_raised_text,
    busy_text,
    collective_text,
    culprits_text,
    exit_advice,
    exit_text,
    group_text,
    stack_place_text,
    verb,
    waiters_text,
)
from watchdog.explain.advice import PEER_EXITED
from watchdog.model import CollectiveRef, Frame, JobSnapshot, Kind, RankState, Verdict
from watchdog.text import clock, ranks_text

_Side = TypeVar("_Side")


def decide(snapshot: JobSnapshot) -> Verdict | None:
    """The verdict for one job at one instant; None when nothing is wrong (yet), or when every
    live rank works outside any collective (a long phase everywhere, until the busy timeout)."""
    exited = _rank_exited(snapshot)
    if exited is not None or not snapshot.stalled:
        return exited
    job = StallView.of(snapshot)
    if not job.alive:
        return None
    found = next((v for v in (rule(job) for rule in _STALL_RULES) if v is not None), None)
    if found is None and any(in_open_phase(rank) for rank in job.alive.values()):
        return None  # a rank said it would be busy this long (`watchdog.phase`)
    return _tiered(job, found or _unexplained(job))


# --- hung or busy ----------------------------------------------------------------------------


def _tiered(job: StallView, hang: Verdict) -> Verdict | None:
    """A hang verdict stands only when its culprits show no progress. A culprit that works
    while its peers wait is busy (RANK_BUSY, a notice) until the busy timeout; when every live
    rank works outside any collective, the job is in a long phase and nothing is reported."""
    busy = {r: sign for r in hang.culprit_ranks if r in job.alive and (sign := job.progress(r))}
    if not busy:
        return hang
    stalled_for = job.snapshot.stalled_for
    if stalled_for >= job.snapshot.busy_timeout:
        first = next(iter(busy))
        return replace(hang, summary=f"{hang.summary}; {ranks_text(busy)} kept working "
                                     f"({busy[first]}) for {stalled_for:.0f} s, past the busy "
                                     "timeout")
    if not hang.waiting_ranks and all(r in busy or job.progress(r) for r in job.alive):
        return None
    summary = busy_text(job, busy)
    idle = [r for r in hang.culprit_ranks if r not in busy]
    if idle:
        summary += f"; {ranks_text(idle)} made no progress outside any collective"
    if hang.waiting_ranks:
        summary += f"; {waiters_text(job, hang.waiting_ranks)}"
    return Verdict(Kind.RANK_BUSY, summary, tuple(busy), hang.waiting_ranks, hang.collective)


def _unexplained(job: StallView) -> Verdict:
    """A stall no rule explains is still reported, with what is known: silence is no verdict."""
    waiters = job.waiters()
    summary = (f"no rank made progress for {job.snapshot.stalled_for:.0f} s and the evidence "
               "names no culprit")
    return Verdict(Kind.RANK_STALLED, summary + (f"; {waiters_text(job, waiters)}"
                                                 if waiters else ""), (), waiters)


# --- RANK_EXITED ---------------------------------------------------------------------------


def _rank_exited(snapshot: JobSnapshot) -> Verdict | None:
    exited = sorted((r for r in snapshot.ranks if not r.alive), key=_exit_order)
    if not exited or not _still_needed(snapshot, exited[0]):
        return None
    first = exited[0]
    alike = _raised_alike(first, exited)
    blamed = {r.rank for r in alike}
    peers = [r for r in snapshot.ranks if r.rank not in blamed]
    # Peers that died after it (their connection dropped) still show where they waited.
    awaited = (awaited_collective(snapshot, peer, first) for peer in peers)
    if len(alike) > 1 and first.exit_reason is not None:
        culprits = sorted(blamed)
        summary = all_raised_text(first.exit_reason, culprits,
                                  max(snapshot.world_size, len(snapshot.ranks)))
        if peers:
            summary += f"; {ranks_text(r.rank for r in peers)} still needed them"
    else:
        culprits = [first.rank]
        summary = f"{exit_text(first)} while {ranks_text(r.rank for r in peers)} still needed it"
    return Verdict(
        Kind.RANK_EXITED,
        summary,
        tuple(culprits),
        tuple(r.rank for r in peers if latest_pending(r) is not None),
        next((ref for ref in awaited if ref is not None), None),
        advice=exit_advice(first),
    )


def _raised_alike(first: RankState, exited: Sequence[RankState]) -> list[RankState]:
    """The exited ranks that raised what `first` raised, at the same place of the user's code:
    one bug that every rank running that code hits, not a rank to blame. Only `first` when it
    raised nothing, lost a peer (every victim raises that alike), or its place is unknown."""
    key = _raise_site(first)
    if key is None:
        return [first]
    return [rank for rank in exited if _raise_site(rank) == key]


def _raise_site(rank: RankState) -> tuple[str, Frame] | None:
    """(exception type, innermost frame of the user's own code) of what the rank raised."""
    reason = rank.exit_reason
    if reason is None or not reason.exception or _lost_a_peer(rank):
        return None
    frame = stuck_frame(reason.frames)
    return None if frame is None else (reason.exception, frame)


def _exit_order(rank: RankState) -> tuple[bool, float, int]:
    """By time, except that a rank that raised because a peer closed its connection comes after
    the ranks that ended for reasons of their own. The kernel dates a killed process's exit when
    its last thread is gone, which can be after its sockets closed and a peer raised: 16 ms
    after, once, on a loaded machine."""
    return (_lost_a_peer(rank), rank.exited_at or 0.0, rank.rank)


def _lost_a_peer(rank: RankState) -> bool:
    advice = exit_advice(rank)
    return advice is not None and advice.category == PEER_EXITED


def _still_needed(snapshot: JobSnapshot, first: RankState) -> bool:
    others = [r for r in snapshot.ranks if r.rank != first.rank]
    if any(not r.alive and not finished_cleanly(r) for r in others):
        return True
    alive = [r for r in others if r.alive]
    if not alive:
        return False  # every rank is gone and the others finished: a normal end
    if not finished_cleanly(first):
        return True
    # A clean early finish is normal while peers keep running; it hurts once they wait for it.
    return snapshot.stalled or any(awaited_collective(snapshot, peer, first) for peer in alive)


# --- the stall rules, in priority order ----------------------------------------------------


def _wedged(job: StallView) -> Verdict | None:
    reasons = {r: wedge_reason(rank, job.snapshot.stacks.get(r), job.snapshot.stalled_for)
               for r, rank in job.alive.items()}
    wedged = [r for r, why in reasons.items() if why and not job.waits_with_others(r)]
    if not wedged:
        return None
    clauses = [f"{culprits_text(job, [r])} {reasons[r]}" for r in wedged]
    waiters = job.waiters(excluding=wedged)
    summary = " and ".join(clauses) + (f"; {waiters_text(job, waiters)}" if waiters else "")
    return Verdict(Kind.RANK_WEDGED, summary, tuple(wedged), waiters)


def _mismatch(job: StallView) -> Verdict | None:
    return _same_seq_mismatch(job) or _crossed_mismatch(job)


def _same_seq_mismatch(job: StallView) -> Verdict | None:
    """Members at the same #N, all waiting, in different ops (docs/design.md's trap)."""
    for frontier in job.frontiers:
        by_op = frontier.ranks_by_op()
        if len(by_op) < 2 or not frontier.all_waiting:
            continue
        majority = _largest(by_op)
        culprits = sorted(r for op, ranks in by_op.items() if op != majority for r in ranks)
        sides = [
            f"{culprits_text(job, ranks)} {verb(ranks, 'is')} in {op} #{frontier.seq}"
            for op, ranks in by_op.items()
            if op != majority
        ]
        summary = (
            f"{' and '.join(sides)} on {group_text(frontier.group, frontier.members)} while "
            f"{ranks_text(by_op[majority])} {verb(by_op[majority], 'is')} in {majority} "
            f"#{frontier.seq} since {clock(frontier.since(by_op[majority]))}"
        )
        waiters, ref = job.waiters(culprits), frontier.ref(majority)
        return Verdict(Kind.COLLECTIVE_MISMATCH, summary, tuple(culprits), waiters, ref)
    return None


def _crossed_mismatch(job: StallView) -> Verdict | None:
    """Every rank that some collective waits for waits itself for another rank: a cycle."""
    frontiers = _missing_frontiers(job)
    behind = {r for frontier in frontiers for r in frontier.behind}
    waiting_for_others = {r for frontier in frontiers for r in frontier.waiters}
    if not frontiers or not behind <= waiting_for_others:
        return None
    places: dict[CollectiveRef, list[int]] = {}
    for rank in sorted(waiting_for_others):
        place = job.waiting_in(rank)
        if place is not None:
            places.setdefault(place, []).append(rank)
    if len(places) < 2:
        return None
    majority = _largest(places)
    culprits = sorted(r for place, ranks in places.items() if place != majority for r in ranks)
    summary = (
        f"{waiters_text(job, culprits)} while {waiters_text(job, places[majority])}, "
        "each side waiting for the other"
    )
    waiters = job.waiters(culprits)
    return Verdict(Kind.COLLECTIVE_MISMATCH, summary, tuple(culprits), waiters, majority)


def _largest(sides: Mapping[_Side, Sequence[int]]) -> _Side:
    """The side holding the most ranks; of equal sides, the one whose lowest rank is highest."""
    return max(sides, key=lambda side: (len(sides[side]), min(sides[side])))


def _missing(job: StallView) -> Verdict | None:
    if job.stack_only:
        return _stack_only_missing(job)
    frontiers = _missing_frontiers(job)
    culprits = sorted({r for frontier in frontiers for r in frontier.behind if job.blameable(r)})
    if not culprits:
        return None  # whoever is missing waits elsewhere (a cycle) or is in a declared phase
    chosen = max(
        (f for f in frontiers if set(f.behind) & set(culprits)),
        key=lambda f: (set(f.behind) <= set(culprits), len(f.waiters)),
    )
    ref = chosen.ref(_largest(chosen.ranks_by_op()))
    there = set(chosen.waiters)
    others = [r for r in job.waiters(culprits) if r not in there]
    summary = (
        f"{culprits_text(job, [r for r in chosen.behind if r in culprits])} never reached "
        f"{collective_text(ref)}; {ranks_text(chosen.waiters)} {verb(chosen.waiters, 'waits')} "
        f"there since {clock(chosen.since(chosen.waiters))}"
    )
    if others:
        summary += f"; {waiters_text(job, others)}"
    return Verdict(Kind.MISSING_RANKS, summary, tuple(culprits), job.waiters(culprits), ref)


def _missing_frontiers(job: StallView) -> list[Frontier]:
    return [frontier for frontier in job.frontiers if frontier.behind and frontier.waiters]


def _stack_only_missing(job: StallView) -> Verdict | None:
    waiters = job.waiters()
    suspects = [r for r in job.alive if job.blameable(r)]
    if not waiters or not suspects:
        return None
    summary = (
        f"{culprits_text(job, suspects)} never reached the collective that {ranks_text(waiters)} "
        f"{verb(waiters, 'waits')} in ({stack_place_text(job, waiters[0])})"
    )
    return Verdict(Kind.MISSING_RANKS, summary, tuple(suspects), waiters)


def _all_in_collective(job: StallView) -> Verdict | None:
    if job.stack_only:
        return _stack_only_all_in(job)
    for frontier in job.frontiers:
        by_op = frontier.ranks_by_op()
        if frontier.behind or len(by_op) != 1 or not frontier.all_waiting:
            continue
        ref = frontier.ref(next(iter(by_op)))
        idle = [r for r in frontier.waiters if job.stack_says_waiting(r) is False]
        if idle and len(idle) < len(frontier.waiters):
            return _entered_but_idle(job, frontier, ref, idle)
        summary = (
            f"{ranks_text(frontier.waiters)} all entered {collective_text(ref)} by "
            f"{clock(max(p.entered_at for p in frontier.arrived.values()))} and none completed: "
            "a communication fault, not a rank that never arrived"
        )
        return Verdict(Kind.ALL_IN_COLLECTIVE, summary, (), frontier.waiters, ref)
    return None


def _entered_but_idle(
    job: StallView, frontier: Frontier, ref: CollectiveRef, idle: list[int]
) -> Verdict | None:
    """With DDP counted at forward, a rank stuck in its own forward has 'entered' the all-reduce;
    its stack, outside any collective while its peers' are inside one, gives it away."""
    culprits = [r for r in idle if not in_open_phase(job.alive[r])]
    if not culprits:
        return None
    waiters = [r for r in frontier.waiters if r not in idle]
    summary = (
        f"{culprits_text(job, culprits)} entered {collective_text(ref)} but never got to "
        f"communicate; {ranks_text(waiters)} {verb(waiters, 'waits')} there since "
        f"{clock(frontier.since(waiters))}"
    )
    return Verdict(Kind.MISSING_RANKS, summary, tuple(culprits), job.waiters(culprits), ref)


def _stack_only_all_in(job: StallView) -> Verdict | None:
    waiters = job.waiters()
    if len(waiters) != len(job.alive):
        return None
    summary = (
        f"{ranks_text(waiters)} all wait in a collective ({stack_place_text(job, waiters[0])}) "
        "and none completes: a communication fault, not a rank that never arrived"
    )
    return Verdict(Kind.ALL_IN_COLLECTIVE, summary, (), waiters)


def _stalled(job: StallView) -> Verdict | None:
    suspects = [r for r in job.alive if job.blameable(r)]
    culprits = [r for r in suspects if not job.stack_says_waiting(r)] or suspects
    if not culprits:
        return None
    waiters = job.waiters(culprits)
    summary = (
        f"{culprits_text(job, culprits)} made no progress for {job.snapshot.stalled_for:.0f} s "
        "outside any collective"
    )
    if waiters:
        summary += f"; {waiters_text(job, waiters)}"
    return Verdict(Kind.RANK_STALLED, summary, tuple(culprits), waiters)


def _node_unreachable(job: StallView) -> Verdict | None:
    """The stalled ranks may sit on a node nobody can see: name the node, blame no rank."""
    snapshot = job.snapshot
    if not snapshot.unreachable_nodes:
        return None
    lost = [r for r, node in sorted(snapshot.rank_nodes.items())
            if node in snapshot.unreachable_nodes]
    node = snapshot.unreachable_nodes[0]
    summary = (f"node {', '.join(snapshot.unreachable_nodes)} stopped reporting: the state of "
               f"{ranks_text(lost) if lost else 'its ranks'} is unknown; the job made no "
               f"progress for {snapshot.stalled_for:.0f} s")
    return Verdict(Kind.NODE_UNREACHABLE, summary, (), job.waiters(excluding=lost), node=node)


_STALL_RULES: tuple[Callable[[StallView], Verdict | None], ...] = (
    _node_unreachable,
    _wedged,
    setup_stall,
    _mismatch,
    _missing,
    _all_in_collective,
    _stalled,
)
