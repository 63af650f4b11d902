"""Rule 2.4, COLLECTIVE_MISMATCH: members at one sequence number in different ops, or ranks
that wait in different collectives, each for the other side (rank 0 in its pair's collective,
ranks 1-3 in the world's). Tried before MISSING_RANKS because each side of a mismatch looks
"missing" from the other (docs/design.md's barrier trap).

Ties: every side but the largest is blamed; between equal sides, the side holding the lowest
rank is blamed, since rank-0-only branches are where stray collectives usually live.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from watchdog.coordinator.view import Place, StallView
from watchdog.coordinator.wording import culprits_text, group_text, verb, waiters_text
from watchdog.model import Kind, Verdict
from watchdog.text import clock, ranks_text

_Side = TypeVar("_Side")


def judge(job: StallView) -> Verdict | None:
    return _same_seq_mismatch(job) or _crossed_mismatch(job)


def largest(sides: Mapping[_Side, Sequence[int]]) -> _Side:
    """The side holding the most ranks; of equal sides, the one whose lowest rank is highest."""
    return max(sides, key=lambda side: (len(sides[side]), min(sides[side])))


def _same_seq_mismatch(job: StallView) -> Verdict | None:
    """Members at the same #N, all waiting, in different ops (docs/design.md's trap)."""
    for frontier in job.frontiers:
        by_op = frontier.by_op
        if len(by_op) < 2 or not frontier.all_waiting:
            continue
        majority = largest(by_op)
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
    frontiers = job.missing_frontiers
    behind = {r for frontier in frontiers for r in frontier.behind}
    waiting_for_others = {r for frontier in frontiers for r in frontier.waiters}
    if not frontiers or not behind <= waiting_for_others:
        return None
    places: dict[Place, list[int]] = {}
    for rank in sorted(waiting_for_others):
        place = job.place_of(rank)
        if place is not None:
            places.setdefault(place, []).append(rank)
    if len(places) < 2:
        return None
    majority = largest(places)
    culprits = sorted(r for place, ranks in places.items() if place != majority for r in ranks)
    summary = (
        f"{waiters_text(job, culprits)} while {waiters_text(job, places[majority])}, "
        "each side waiting for the other"
    )
    waiters = job.waiters(culprits)
    return Verdict(Kind.COLLECTIVE_MISMATCH, summary, tuple(culprits), waiters,
                   job.ref_at(majority))
