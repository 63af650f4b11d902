"""The wrapper of DistributedSampler's iteration, for the sampler_epoch_reused check (runs inside
every training rank)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from watchdog.hook.recorder import Recorder


def wrap_sampler_iter(original: Callable[[Any], Any], rec: Recorder) -> Callable[[Any], Any]:
    """A shuffling DistributedSampler iterated again with the same epoch (no set_epoch)."""
    iterated = rec.checks.sampler_iterated

    @functools.wraps(original)
    def __iter__(sampler: Any) -> Any:
        iterator = original(sampler)
        if rec.enabled:
            rec.run_check(iterated, sampler, iterator)
        return iterator

    return __iter__
