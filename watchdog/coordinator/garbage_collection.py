"""How often the coordinator's process collects its cyclic garbage (coordinator process).

A coordinator keeps a record of every rank alive and replaces it at each report: at 131,072
ranks, several million objects, none of them in a cycle. Python's defaults run a full
collection, which walks every one of them, every 70,000 allocations or so once the young
generations fill: half of the time a 131,072-rank diagnosis took went to those walks
(tests/bench/coordinator_scale.py). Full collections are made about a hundred times rarer;
the young generations, where cyclic garbage is found, are collected as before.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

FULL_EVERY = 1000  # young-generation collections between two full ones (Python's default: 10)


@contextlib.contextmanager
def sparing_full_collections() -> Iterator[None]:
    """Within: full collections FULL_EVERY young ones apart; the thresholds are put back after."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], FULL_EVERY)
    try:
        yield
    finally:
        gc.set_threshold(*before)
