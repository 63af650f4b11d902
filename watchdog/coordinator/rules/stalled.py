"""Rule 2.7, RANK_STALLED: no collective explains the stall and ranks stopped progressing; the
culprits are the ranks whose stacks are outside a collective, the others wait (in a collective
the hook could not record: DDP's constructor on a torch whose helpers it does not know). A
culprit whose hook saw no process group and no set-up call never reached torch.distributed:
said so, since no peer can be waiting for it and "outside any collective" would hide why."""

from __future__ import annotations

from watchdog.coordinator.view import StallView
from watchdog.coordinator.wording import culprits_text, waiters_text
from watchdog.model import Kind, RankState, Verdict
from watchdog.text import ranks_text

NEVER_JOINED = "never reached torch.distributed (no init_process_group call)"


def judge(job: StallView) -> Verdict | None:
    suspects = [r for r, seen in job.alive.items() if seen.blameable]
    culprits = [r for r in suspects if not job.alive[r].stack_waiting] or suspects
    if not culprits:
        return None
    waiters = job.waiters(culprits)
    never = [r for r in culprits if never_joined(job.alive[r].state)]
    stalled = f"made no progress for {job.snapshot.stalled_for:.0f} s"
    if never == culprits:
        summary = f"{culprits_text(job, culprits)} {NEVER_JOINED} and {stalled}"
    else:
        summary = f"{culprits_text(job, culprits)} {stalled} outside any collective"
        summary += f"; {ranks_text(never)} {NEVER_JOINED}" if never else ""
    if waiters:
        summary += f"; {waiters_text(job, waiters)}"
    return Verdict(Kind.RANK_STALLED, summary, tuple(culprits), waiters)


def never_joined(state: RankState) -> bool:
    """Its hook (which records from interpreter start under torchrun) saw no process group
    and no call to set one up."""
    return state.hooked and not state.groups and not state.setup
