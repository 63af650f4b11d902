"""One look at a job, its stacks in hand (coordinator process): the verdict to tell now, or
nothing yet and when to look again (set on the job with `JobView.hold`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from watchdog.coordinator.jobs import LEARNED_MARGIN, JobView
from watchdog.coordinator.node_silence import NodeSilence
from watchdog.coordinator.startup import early_verdict_stands
from watchdog.coordinator.verdict import decide
from watchdog.frames import stuck_frame
from watchdog.model import JobSnapshot, Kind, RankStack, Severity, Verdict
from watchdog.text import printable

log = logging.getLogger(__name__)

RECHECK_S = 10.0  # a stall whose ranks work is looked at again after this long


def verdict_to_tell(job: JobView, snapshot: JobSnapshot, now: float,
                    early: bool) -> Verdict | None:
    """The verdict on `snapshot` that is news now, else None; `early`: a look during the
    warm-up, whose verdict stands only on evidence of a rank idle while its peers wait."""
    verdict = decide(snapshot)
    if early and verdict is not None and not early_verdict_stands(snapshot, verdict):
        verdict = None  # start-up that shows work, or no waiter: the warm-up goes on
    if verdict is None:  # progress resumed, or every rank works: look again later
        job.busy = snapshot.stalled and not early
        # an early look again soon, but never past the end of the warm-up grace
        job.hold(now + min(RECHECK_S, job.threshold() - snapshot.stalled_for
                           if early else RECHECK_S))
        return None
    if job.stacks_only and job.stacks_moved(snapshot.stacks):
        return None  # no hook: a changed stack was the only sign of progress, and here it is
    return None if _hold(job, snapshot, verdict, now) else verdict


def late_but_alive(job: JobView, unreachable: tuple[str, ...], stacks: dict[int, RankStack],
                   nodes: NodeSilence, now: float) -> bool:
    """Whether a node taken for unreachable answered for its ranks' stacks just now: its
    agent lives, only its reports are late (a slow scan), so its ranks' state is not known
    yet and nothing can be said."""
    answered = {job.nodes.get(rank) for rank in stacks}
    late = [node for node in unreachable if node in answered]
    if late:
        log.warning("job %s: node %s answered for stacks but sent no report for %.0f s; "
                    "looking again later", printable(job.job_id), printable(late[0]),
                    nodes.age(late[0], now))
    return bool(late)


def _hold(job: JobView, snapshot: JobSnapshot, verdict: Verdict, now: float) -> bool:
    """Whether to say nothing now, and when to look again: a stall where an earlier one
    ended by itself, that has not lasted as long yet; a notice already said."""
    if verdict.kind is Kind.RANK_EXITED:
        return False
    job.place = culprit_place(snapshot, verdict.culprit_ranks)
    expected = job.expected(job.place)
    if snapshot.stalled_for < expected:
        job.hold(now + expected - snapshot.stalled_for)
        log.info("job %s: a stall at %s ended by itself after %.0f s before; waiting",
                 job.job_id, job.place, expected / LEARNED_MARGIN)
        return True
    if verdict.severity is not Severity.HANG:  # again soon, and when the busy timeout passes
        job.busy = True
        job.hold(now + min(RECHECK_S, snapshot.busy_timeout - snapshot.stalled_for))
        announced = job.incident if job.incident_open else None  # a notice is said once
        return announced is not None and (announced["kind"], announced["culprit_ranks"]) == (
            verdict.kind, list(verdict.culprit_ranks))
    return False


def culprit_place(snapshot: JobSnapshot, culprits: Sequence[int]) -> str:
    """'train.py:save_checkpoint': where the first culprit with a stack is stuck, or ''."""
    for rank in culprits:
        stack = snapshot.stacks.get(rank)
        frame = stuck_frame(stack.frames) if stack is not None else None
        if frame is not None:
            return f"{frame.file}:{frame.function}"
    return ""
