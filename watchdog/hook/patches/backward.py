"""The wrapper of `torch.Tensor.backward`, for the nonfinite_loss check and the straggler's
measure (runs inside every training rank): the tensor backward() is called on is the step's
loss, and under DDP the backward ends waiting for the gradients' all-reduce."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from watchdog.hook.patches import drop_own_frame
from watchdog.hook.recorder import Recorder


def wrap_backward(original: Callable[..., Any], rec: Recorder) -> Callable[..., Any]:
    """Keep each loss for the publisher thread to read (hook/losses.py): a reference and a
    step count, never a read of the value here, which would wait for a GPU; and drop the ones
    it has read. (`watching` is False while the recorder is not enabled.)"""
    losses = rec.checks.losses
    waiting, read, clock = losses.waiting, losses.read, time.perf_counter

    @functools.wraps(original)
    def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if losses.watching:
            waiting.append((rec.steps, tensor))
            if read:
                read.clear()
        try:
            if rec._pending is None and rec.ddp_calls == rec.ddp_done:  # nothing to wait for
                return original(tensor, *args, **kwargs)
            # Its compute is alike on every replica and cancels out when ranks are compared:
            # what differs is the wait for the slowest rank's gradients.
            began = clock()
            result = original(tensor, *args, **kwargs)
            rec.wait_s += clock() - began
            return result
        except BaseException as e:
            drop_own_frame(e)
            raise

    return backward
