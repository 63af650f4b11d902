"""Rule 2.7, RANK_STALLED: no collective explains the stall and ranks stopped progressing; the
culprits are the ranks whose stacks are outside a collective, the others wait (in a collective
the hook could not record: DDP's constructor on a torch whose helpers it does not know)."""

from __future__ import annotations

from watchdog.coordinator.view import StallView
from watchdog.coordinator.wording import culprits_text, waiters_text
from watchdog.model import Kind, Verdict


def judge(job: StallView) -> Verdict | None:
    suspects = [r for r, seen in job.alive.items() if seen.blameable]
    culprits = [r for r in suspects if not job.alive[r].stack_waiting] or suspects
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
