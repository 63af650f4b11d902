"""Adaptive stall detection for one job (runs in the coordinator; pure: time is an argument).

A job is stalled when its ranks' total event count has not changed for longer than
`max(floor, k * p99 of the gaps between changes)`. The gaps come from two places: the ones the
coordinator sees between reports, and the ones each rank's hook measures by its own clock from
its first optimizer step on (`hook_p99`), which are real after a few steps. Until either is known
the job gets the longer warm-up grace; a declared phase stretches the threshold to its own
timeout; `fixed` (--stall-timeout) overrides it all. A change is dated by the hook's own stamp
where it has one (`progress_at`), so a report's delay does not delay the stall.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


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
        self._events: int | None = None
        self._changed_at: float | None = None
        self._warm = False  # whether the job was past start-up at the last change

    def observe(self, events_total: int, now: float, progress_at: float | None = None,
                warm: bool = True) -> bool:
        """Record the job's total event count as of `now`; `progress_at`, when known, is when the
        ranks' hooks last saw it change, by their own clocks (never later than `now`). A gap
        that began before the job was `warm` is start-up, not the job's pace: it is not kept.
        Returns whether the count changed."""
        if events_total == self._events:
            return False
        changed_at = now
        if progress_at is not None and (self._changed_at is None or progress_at > self._changed_at):
            changed_at = min(now, progress_at)
        if self._changed_at is not None and self._warm:
            self._gaps.append(changed_at - self._changed_at)
        self._events, self._changed_at, self._warm = events_total, changed_at, warm
        return True

    def threshold(self, phase_timeout: float = 0.0, hook_p99: float | None = None) -> float:
        """Seconds without progress after which the job counts as stalled; `hook_p99` is the
        slowest rank's own p99 gap, once its hook has measured enough of them."""
        policy = self.policy
        known = [_p99(self._gaps)] if len(self._gaps) >= policy.min_samples else []
        if hook_p99 is not None:
            known.append(hook_p99)
        if policy.fixed is not None:
            base = policy.fixed
        elif not known:
            base = max(policy.floor, policy.warmup)
        else:
            base = max(policy.floor, policy.k * max(known))
        return max(base, phase_timeout)

    def stalled_for(self, now: float) -> float:
        """Seconds since the event count last changed (0 before the first observation)."""
        return 0.0 if self._changed_at is None else max(0.0, now - self._changed_at)

    def is_stalled(self, now: float, phase_timeout: float = 0.0,
                   hook_p99: float | None = None) -> bool:
        seen = self._changed_at is not None
        return seen and self.stalled_for(now) >= self.threshold(phase_timeout, hook_p99)


def _p99(gaps: deque[float]) -> float:
    ordered = sorted(gaps)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]  # nearest-rank percentile
