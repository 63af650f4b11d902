"""Rule 2.2, RANK_WEDGED: a process that cannot run (stopped, in uninterruptible sleep, or
running no Python) explains everything downstream of it. A stopped process (state T) is wedged
even inside a collective its peers wait in; a stale heartbeat or D state there is only the wait
itself."""

from __future__ import annotations

from watchdog.coordinator.view import StallView
from watchdog.coordinator.wording import culprits_text, waiters_text
from watchdog.model import Kind, Verdict


def judge(job: StallView) -> Verdict | None:
    wedged = [r for r, seen in job.alive.items() if seen.wedged and not job.waits_with_others(r)]
    if not wedged:
        return None
    clauses = [f"{culprits_text(job, [r])} {job.alive[r].wedged}" for r in wedged]
    waiters = job.waiters(excluding=wedged)
    summary = " and ".join(clauses) + (f"; {waiters_text(job, waiters)}" if waiters else "")
    return Verdict(Kind.RANK_WEDGED, summary, tuple(wedged), waiters)
