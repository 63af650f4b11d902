"""The wrapper of `torch.Tensor.backward`, for the nonfinite_loss check (runs inside every
training rank): the tensor backward() is called on is the step's loss."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from watchdog.hook.patches import drop_own_frame
from watchdog.hook.recorder import Recorder


def wrap_backward(original: Callable[..., Any], rec: Recorder) -> Callable[..., Any]:
    """Keep each loss for the publisher thread to read (hook/losses.py): a reference and a
    step count, never a read of the value here, which would wait for a GPU."""
    losses = rec.checks.losses
    waiting = losses.waiting

    @functools.wraps(original)
    def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if losses.watching and rec.enabled:
            waiting.append((rec.steps, tensor))
        try:
            return original(tensor, *args, **kwargs)
        except BaseException as e:
            drop_own_frame(e)
            raise

    return backward
