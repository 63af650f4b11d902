"""Rule 2.5, MISSING_RANKS: some members entered collective #N, others never did, and those
wait in no collective (pending, or a collective frame in their stack) and are in no open phase.
Ranks that report no group (no hook) are judged by their stacks alone: the ranks outside any
collective while others' stacks wait in one.

Of the groups that show a culprit missing, the summary names the one whose missing members are
all culprits, then the one with the most waiters, then the lowest group name.
"""

from __future__ import annotations

from watchdog.coordinator.rules.mismatch import largest
from watchdog.coordinator.view import StallView
from watchdog.coordinator.wording import (
    collective_text,
    culprits_text,
    stack_place_text,
    verb,
    waiters_text,
)
from watchdog.model import Kind, Verdict
from watchdog.text import clock, ranks_text


def judge(job: StallView) -> Verdict | None:
    if job.stack_only:
        return _stack_only_missing(job)
    frontiers = job.missing_frontiers
    culprits = sorted({r for frontier in frontiers for r in frontier.behind
                       if job.alive[r].blameable})
    if not culprits:
        return None  # whoever is missing waits elsewhere (a cycle) or is in a declared phase
    chosen = max(
        (f for f in frontiers if set(f.behind) & set(culprits)),
        key=lambda f: (set(f.behind) <= set(culprits), len(f.waiters)),
    )
    ref = chosen.ref(largest(chosen.by_op))
    there, waiters = set(chosen.waiters), job.waiters(culprits)
    others = [r for r in waiters if r not in there]
    summary = (
        f"{culprits_text(job, [r for r in chosen.behind if r in culprits])} never reached "
        f"{collective_text(ref)}; {ranks_text(chosen.waiters)} {verb(chosen.waiters, 'waits')} "
        f"there since {clock(chosen.since(chosen.waiters))}"
    )
    if others:
        summary += f"; {waiters_text(job, others)}"
    return Verdict(Kind.MISSING_RANKS, summary, tuple(culprits), waiters, ref)


def _stack_only_missing(job: StallView) -> Verdict | None:
    waiters = job.waiters()
    suspects = [r for r, seen in job.alive.items() if seen.blameable]
    if not waiters or not suspects:
        return None
    summary = (
        f"{culprits_text(job, suspects)} never reached the collective that {ranks_text(waiters)} "
        f"{verb(waiters, 'waits')} in ({stack_place_text(job, waiters[0])})"
    )
    return Verdict(Kind.MISSING_RANKS, summary, tuple(suspects), waiters)
