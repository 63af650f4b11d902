"""Wording shared by every message for people: clock times and rank lists (any process).

One rank-list formatter serves verdicts, tables and `watchdog explain`, so a job's ranks read the
same wherever they appear.
"""

from __future__ import annotations

import time
from collections.abc import Iterable


def clock(unix_seconds: float) -> str:
    """Local wall-clock time, 'HH:MM:SS'."""
    return time.strftime("%H:%M:%S", time.localtime(unix_seconds))


def ranks_text(ranks: Iterable[int]) -> str:
    """'rank 1', 'ranks 0,2,3' or, for runs of three or more, 'ranks 0-289,291-299': a verdict
    on a large job stays one readable sentence."""
    listed = list(ranks)
    if len(listed) == 1:
        return f"rank {listed[0]}"
    parts: list[str] = []
    start = 0
    for end in range(1, len(listed) + 1):
        if end == len(listed) or listed[end] != listed[end - 1] + 1:
            run = listed[start:end]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)))
            start = end
    return f"ranks {','.join(parts)}"
