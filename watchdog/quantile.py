"""The pace statistic that the hook and the coordinator share (stdlib only: the hook loads it)."""

from __future__ import annotations

import math
from collections.abc import Iterable

# The longest gaps of a window that never set the pace on their own: a gap that long must come
# back this many times more before the job's rhythm includes it.
OUTLIERS = 2


def steady_p99(gaps: Iterable[float]) -> float:
    """The nearest-rank p99 of `gaps` (at least one), never above the third longest.

    A plain p99 of a few hundred gaps is their longest one: a single 30 s evaluation would set
    the stall threshold to k x 30 s for as long as it stays in the window (minutes). One or two
    long gaps are an event, three are a rhythm.
    """
    ordered = sorted(gaps)
    count = len(ordered)
    return ordered[max(0, min(math.ceil(0.99 * count) - 1, count - 1 - OUTLIERS))]
