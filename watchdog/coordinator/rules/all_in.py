"""Rule 2.6, ALL_IN_COLLECTIVE: every member entered #N and none completed, a communication
fault. Its evidence is ranks whose stacks wait in that collective. DDP's all-reduce counts as
entered at forward: a rank whose stack is outside any collective while its peers' stacks wait
never got to communicate (MISSING_RANKS), and when no stack waits at all (every rank still in
its forward: compiling it, say), nobody communicates and no fault is claimed: the ranks made no
progress outside any collective (RANK_STALLED), which the tier then weighs (compiling is work).
"""

from __future__ import annotations

from watchdog.coordinator.view import Frontier, StallView
from watchdog.coordinator.wording import collective_text, culprits_text, stack_place_text, verb
from watchdog.model import CollectiveRef, Kind, Verdict
from watchdog.text import clock, ranks_text


def judge(job: StallView) -> Verdict | None:
    if job.stack_only:
        return _stack_only_all_in(job)
    for frontier in job.frontiers:
        by_op = frontier.by_op
        if frontier.behind or len(by_op) != 1 or not frontier.all_waiting:
            continue
        ref = frontier.ref(next(iter(by_op)))
        idle = [r for r in frontier.waiters if job.alive[r].stack_waiting is False]
        if idle and len(idle) < len(frontier.waiters):
            return _entered_but_idle(job, frontier, ref, idle)
        if idle:
            return _none_waits(job, ref, idle)
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
    culprits = [r for r in idle if not job.alive[r].in_phase]
    if not culprits:
        return None
    waiters = [r for r in frontier.waiters if r not in idle]
    summary = (
        f"{culprits_text(job, culprits)} entered {collective_text(ref)} but never got to "
        f"communicate; {ranks_text(waiters)} {verb(waiters, 'waits')} there since "
        f"{clock(frontier.since(waiters))}"
    )
    return Verdict(Kind.MISSING_RANKS, summary, tuple(culprits), job.waiters(culprits), ref)


def _none_waits(job: StallView, ref: CollectiveRef, idle: list[int]) -> Verdict | None:
    """The hooks count every member in the collective, and no stack waits in one: their
    counters and their stacks disagree, so no communication fault is claimed."""
    culprits = [r for r in idle if not job.alive[r].in_phase]
    if not culprits:
        return None
    summary = (
        f"{culprits_text(job, culprits)} made no progress for {job.snapshot.stalled_for:.0f} s "
        f"outside any collective (the hooks count {collective_text(ref)} as entered, but no "
        "stack waits in a collective)"
    )
    return Verdict(Kind.RANK_STALLED, summary, tuple(culprits), ())


def _stack_only_all_in(job: StallView) -> Verdict | None:
    waiters = job.waiters()
    if len(waiters) != len(job.alive):
        return None
    summary = (
        f"{ranks_text(waiters)} all wait in a collective ({stack_place_text(job, waiters[0])}) "
        "and none completes: a communication fault, not a rank that never arrived"
    )
    return Verdict(Kind.ALL_IN_COLLECTIVE, summary, (), waiters)
