"""The wrapper of `Optimizer._optimizer_step_code`, which counts optimizer steps (runs inside
every training rank)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from watchdog.hook.recorder import Recorder


def wrap_step_code(original: Callable[[Any], None], rec: Recorder) -> Callable[[Any], None]:
    """torch calls `_optimizer_step_code` after every optimizer step, just before the step
    hooks, as its profiler's entry point: counting there costs the step no frame of its own,
    where a global step hook costs one (about 1 us a step, tests/bench/hook_overhead.py).
    torch's function still runs first, so its profiler sees the step as before."""
    stepped = rec.optimizer_stepped

    @functools.wraps(original)
    def _optimizer_step_code(optimizer: Any) -> None:
        original(optimizer)
        stepped(optimizer)

    return _optimizer_step_code
