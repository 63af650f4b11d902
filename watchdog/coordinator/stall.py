"""Adaptive stall detection for one job (runs in the coordinator; pure: time is an argument).

A job is stalled when its ranks' total event count has not changed for longer than
`max(floor, k x the job's pace)`. The pace is `steady_p99` of the gaps between changes that the
coordinator saw, once it saw enough of them, and before that of the gaps each rank's hook
measures by its own clock from its first optimizer step on (`hook_p99`), which are real after a
few steps. The pace is the rhythm of training, not of its phases: a gap the caller says was a
phase (an evaluation on every rank, a declared phase, a stall that was judged) is never kept,
and one long gap never moves the pace. Until a pace is known, and during start-up, the job gets
the longer warm-up grace; a declared phase stretches the threshold to its own timeout; `fixed`
(--stall-timeout) overrides the pace. A change is dated by the hook's own stamp where it has one
(`progress_at`), so a report's delay does not delay the stall, and late news of progress older
than the last change does not restart its clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from watchdog.quantile import steady_p99


@dataclass(frozen=True)
class StallPolicy:
    floor: float = 10.0  # seconds: never call a job stalled sooner
    k: float = 5.0
    warmup: float = 60.0
    fixed: float | None = None
    min_samples: int = 8
    window: int = 512  # gaps kept: a few minutes of a training loop
    busy_timeout: float = 600.0  # a rank that keeps working while its peers wait: hung after


class ProgressTracker:
    """When one job last made progress, and how long its quiet spells usually are."""

    def __init__(self, policy: StallPolicy) -> None:
        self.policy = policy
        self._gaps: deque[float] = deque(maxlen=policy.window)
        self._own_pace: float | None = None  # steady_p99 of the gaps; None until recomputed
        self._events: int | None = None
        self._changed_at: float | None = None
        self._warm = False  # whether the job was past start-up at the last change
        self._phases = 0  # gaps past start-up left out as phases

    def observe(self, events_total: int, now: float, progress_at: float | None = None,
                warm: bool = True, phase: bool = False) -> bool:
        """Record the job's total event count as of `now`; `progress_at`, when every change since
        the last call was stamped, is when the ranks' hooks last saw it change, by their own
        clocks (never later than `now`); None dates the change by `now`. A gap that began before
        the job was `warm` is start-up, and a gap that was a `phase` is not training: neither is
        the job's pace, so neither is kept. Returns whether the job progressed: its count
        changed, later than its last change where the change was stamped (a report held back or
        slow tells of progress the clock already counted)."""
        if events_total == self._events:
            return False
        changed_at = now if progress_at is None else min(now, progress_at)
        if progress_at is not None and self._changed_at is not None \
                and changed_at <= self._changed_at:
            self._events = events_total
            return False
        if self._changed_at is not None and self._warm and phase:
            self._phases += 1
        elif self._changed_at is not None and self._warm:
            self._gaps.append(changed_at - self._changed_at)
            self._own_pace = None
        self._events, self._changed_at, self._warm = events_total, changed_at, warm
        return True

    def pace(self, hook_p99: float | None = None) -> float | None:
        """The job's usual gap between progress: of the gaps seen here once there are enough of
        them (a job-wide gap, the one a stall is measured against, with the phases left out,
        though counted toward enough: the hooks' own gaps hold every phase, a short evaluation
        every few steps made them its pace), else the slowest paced rank's own (`hook_p99`);
        None while neither is known."""
        if not self._gaps or len(self._gaps) + self._phases < self.policy.min_samples:
            return hook_p99
        if self._own_pace is None:
            self._own_pace = steady_p99(self._gaps)
        return self._own_pace

    def evidence_threshold(self, phase_timeout: float = 0.0,
                           hook_p99: float | None = None) -> float:
        """The threshold without the warm-up grace: what the pace alone allows (the floor while
        it is not known). Past it, a job still warming up is looked at, and judged only on
        evidence that a rank is idle while its peers wait (`startup.early_verdict_stands`)."""
        policy, pace = self.policy, self.pace(hook_p99)
        if policy.fixed is not None:
            base = policy.fixed
        elif pace is None:
            base = policy.floor
        else:
            base = max(policy.floor, policy.k * pace)
        return max(base, phase_timeout)

    def threshold(self, phase_timeout: float = 0.0, hook_p99: float | None = None,
                  warming: bool = False) -> float:
        """Seconds without progress after which the job counts as stalled: the warm-up grace
        while it is `warming` or its pace is not known, else the evidence threshold."""
        base = self.evidence_threshold(phase_timeout, hook_p99)
        known = self.policy.fixed is not None or self.pace(hook_p99) is not None
        return max(base, self.policy.warmup) if warming or not known else base

    def stalled_for(self, now: float) -> float:
        """Seconds since the event count last changed (0 before the first observation)."""
        return 0.0 if self._changed_at is None else max(0.0, now - self._changed_at)

    @property
    def seen(self) -> bool:
        return self._changed_at is not None

    def is_stalled(self, now: float, phase_timeout: float = 0.0,
                   hook_p99: float | None = None, warming: bool = False) -> bool:
        return self.seen and self.stalled_for(now) >= self.threshold(phase_timeout, hook_p99,
                                                                     warming)
