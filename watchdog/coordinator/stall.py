"""Adaptive stall detection for one job (runs in the coordinator; pure: time is an argument).

A job is stalled when its ranks' total event count has not changed for longer than
`max(floor, k * p99 of the recent gaps between changes)`. Until `min_samples` gaps are known the
job gets the longer warm-up grace (start-up, compilation and the first steps are slow); a declared
phase stretches the threshold to its own timeout; `fixed` (--stall-timeout) overrides it all.
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


class ProgressTracker:
    """When one job last made progress, and how long its quiet spells usually are."""

    def __init__(self, policy: StallPolicy) -> None:
        self.policy = policy
        self._gaps: deque[float] = deque(maxlen=policy.window)
        self._events: int | None = None
        self._changed_at: float | None = None

    def observe(self, events_total: int, now: float) -> None:
        """Record the job's total event count as of `now`."""
        if events_total == self._events:
            return
        if self._changed_at is not None:
            self._gaps.append(now - self._changed_at)
        self._events, self._changed_at = events_total, now

    def threshold(self, phase_timeout: float = 0.0) -> float:
        """Seconds without progress after which the job counts as stalled."""
        policy = self.policy
        if policy.fixed is not None:
            base = policy.fixed
        elif len(self._gaps) < policy.min_samples:
            base = max(policy.floor, policy.warmup)
        else:
            base = max(policy.floor, policy.k * _p99(self._gaps))
        return max(base, phase_timeout)

    def stalled_for(self, now: float) -> float:
        """Seconds since the event count last changed (0 before the first observation)."""
        return 0.0 if self._changed_at is None else max(0.0, now - self._changed_at)

    def is_stalled(self, now: float, phase_timeout: float = 0.0) -> bool:
        seen = self._changed_at is not None
        return seen and self.stalled_for(now) >= self.threshold(phase_timeout)


def _p99(gaps: deque[float]) -> float:
    ordered = sorted(gaps)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]  # nearest-rank percentile
