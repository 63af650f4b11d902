"""Verdict engine: names the rank that hung a job, and why (runs in the coordinator).

`decide` is a pure function of one JobSnapshot. It tries the rules in the order listed below,
docs/design.md's priority order, and the first that returns a Verdict decides: RANK_EXITED at
any time, the others only once the job is stalled, each on the job's `StallView` (every live
rank's evidence, read once). Each rule lives in a module of its own under `rules/`, where its
summary is built beside its decision. A hang verdict is then tiered: a culprit that shows
progress is busy (RANK_BUSY, a notice) until the busy timeout. A stall no rule explains is
still reported (`_unexplained`).

Group reasoning compares sequence numbers, which every member of a process group counts
identically; ranks that report no group (no hook, or before init_process_group returns) are
judged by their stacks alone. So that one snapshot always gives one verdict: a rank waits where
it entered last (its pending collective with the latest `entered_at`), and waiting_ranks are the
ranks blocked in a collective (pending, or stack in one), culprits aside.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from watchdog.coordinator.rules import (
    all_in,
    exited,
    mismatch,
    missing,
    setup,
    stalled,
    unreachable,
    wedged,
)
from watchdog.coordinator.view import StallView
from watchdog.coordinator.wording import verb, waiters_text
from watchdog.frames import frame_site
from watchdog.model import JobSnapshot, Kind, Verdict
from watchdog.text import ranks_text

# The rules, in docs/design.md's priority order (and nowhere else).
# 1. At any time, on the snapshot alone:
EXIT_RULE: Callable[[JobSnapshot], Verdict | None] = exited.judge  # RANK_EXITED
# 2. Once the job stalled, on its live ranks' evidence:
STALL_RULES: tuple[Callable[[StallView], Verdict | None], ...] = (
    unreachable.judge,  # NODE_UNREACHABLE
    wedged.judge,  # RANK_WEDGED
    setup.judge,  # start-up: MISSING_RANKS or ALL_IN_COLLECTIVE in a set-up call
    mismatch.judge,  # COLLECTIVE_MISMATCH
    missing.judge,  # MISSING_RANKS
    all_in.judge,  # ALL_IN_COLLECTIVE (or MISSING_RANKS: a rank stuck in DDP's forward)
    stalled.judge,  # RANK_STALLED
)


def decide(snapshot: JobSnapshot) -> Verdict | None:
    """The verdict for one job at one instant; None when nothing is wrong (yet), or when every
    live rank works outside any collective (a long phase everywhere, until the busy timeout)."""
    exit_verdict = EXIT_RULE(snapshot)
    if exit_verdict is not None or not snapshot.stalled:
        return exit_verdict
    job = StallView.of(snapshot)
    if not job.alive:
        return None
    found = next((v for v in (rule(job) for rule in STALL_RULES) if v is not None), None)
    if found is None and any(seen.in_phase for seen in job.alive.values()):
        return None  # a rank said it would be busy this long (`watchdog.phase`)
    return _tiered(job, found or _unexplained(job))


def _tiered(job: StallView, hang: Verdict) -> Verdict | None:
    """A hang verdict stands only when its culprits show no progress. A culprit that works
    while its peers wait is busy (RANK_BUSY, a notice) until the busy timeout, and so is the
    work a culprit waiting for a file lock waits on (inductor's cache lock: another rank
    compiles behind it); when every live rank works outside any collective, or waits for such
    a lock, the job is in a long phase and nothing is reported."""
    busy = {r: sign for r in hang.culprit_ranks
            if r in job.alive and (sign := job.alive[r].progress)}
    working = busy or {r: seen.progress for r, seen in job.alive.items() if seen.progress}
    held = [r for r in hang.culprit_ranks
            if working and r not in busy and r in job.alive and job.alive[r].lock_wait]
    if not busy and not held:
        return hang
    busy = busy or working
    stalled_for = job.snapshot.stalled_for
    if stalled_for >= job.snapshot.busy_timeout:
        first = next(iter(busy))
        return replace(hang, summary=f"{hang.summary}; {ranks_text(busy)} kept working "
                                     f"({busy[first]}) for {stalled_for:.0f} s, past the busy "
                                     "timeout")
    if not hang.waiting_ranks and all(r in busy or r in held or seen.progress
                                      for r, seen in job.alive.items()):
        return None
    summary = _busy_text(job, busy)
    if held:
        summary += f"; {ranks_text(held)} {verb(held, 'waits')} for a file lock"
    idle = [r for r in hang.culprit_ranks if r not in busy and r not in held]
    if idle:
        summary += f"; {ranks_text(idle)} made no progress outside any collective"
    if hang.waiting_ranks:
        summary += f"; {waiters_text(job, hang.waiting_ranks)}"
    return Verdict(Kind.RANK_BUSY, summary, tuple(busy), hang.waiting_ranks, hang.collective)


def _busy_text(job: StallView, busy: Mapping[int, str]) -> str:
    """'rank 0 busy in save_checkpoint at train.py:58 for 25 s, writing 41.9 MB/s': where the
    first busy rank with a stack works, and what shows it works."""
    ranks = list(busy)
    first = next((r for r in ranks if job.alive[r].stuck is not None), ranks[0])
    frame = job.alive[first].stuck
    where = "" if frame is None else f" in {frame.function} at {frame_site(frame)}"
    whose = "" if len(ranks) == 1 else f"; rank {first}"
    return (f"{ranks_text(ranks)} busy{where if len(ranks) == 1 else ''} for "
            f"{job.snapshot.stalled_for:.0f} s{whose}{where if len(ranks) > 1 else ''}, "
            f"{busy[first]}")


def _unexplained(job: StallView) -> Verdict:
    """A stall no rule explains is still reported, with what is known: silence is no verdict.
    Ranks that show progress are its culprits, which the tier makes busy, not hung: a
    checkpoint's writer whose stack entered the barrier its peers wait in before its hook said
    so matches no rule (a loaded CI run killed that healthy job)."""
    working = tuple(r for r, seen in job.alive.items() if seen.progress)
    waiters = job.waiters(excluding=working)
    stalled_for = job.snapshot.stalled_for
    summary = (f"the job made no progress for {stalled_for:.0f} s; no rule names a culprit, and "
               f"{ranks_text(working)} {verb(working, 'works')} while the others wait"
               if working else
               f"no rank made progress for {stalled_for:.0f} s and the evidence names no culprit")
    return Verdict(Kind.RANK_STALLED, summary + (f"; {waiters_text(job, waiters)}"
                                                 if waiters else ""), working, waiters)
