"""How fast this rank progresses, by its own clock (runs in the hook's publisher thread).

The coordinator's stall threshold is `k x` the pace of the gaps between progress. Measured here,
the gaps are real after the first few steps, before the coordinator has seen enough of its own,
and free of report and network delays. Gaps count from the first optimizer step on: the time
before it is start-up (imports, compilation, the first batch), which the warm-up grace covers
instead. The pace is `steady_p99`, which one long gap (an evaluation) never moves; the
coordinator also keeps the phases it saw out of its own gaps, and prefers those once it has them.
"""

from __future__ import annotations

from collections import deque

from watchdog.beacon import Pace
from watchdog.quantile import steady_p99

WINDOW = 256  # gaps kept: at 5 publishes a second, about a minute of a fast training loop


class PaceTracker:
    """Fed the rank's event count at each publish; not thread-safe (one publisher)."""

    __slots__ = ("_counting", "_events", "_gaps", "_pace", "progress_at")

    def __init__(self) -> None:
        self._events = -1
        self.progress_at = 0.0  # when the event count last changed; 0: never
        self._counting = False
        self._gaps: deque[float] = deque(maxlen=WINDOW)
        self._pace = Pace()

    def observe(self, events: int, steps: int, now: float) -> Pace:
        """The pace as of `now`, given the events and steps recorded so far; `progress_at`
        becomes `now` when the events changed."""
        if events != self._events:
            if self._counting:
                self._gaps.append(now - self.progress_at)
                self._pace = Pace(gap_p99=steady_p99(self._gaps), gaps=self._pace.gaps + 1)
            self._events, self.progress_at = events, now
            self._counting = steps >= 1
        return self._pace
