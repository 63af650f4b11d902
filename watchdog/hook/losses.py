"""The loss of every step, checked off the training thread (runs inside every training rank;
torch arrives as an argument).

The loss is the tensor backward() is called on. The training thread only keeps a reference to
it with the step it belongs to (the optimizer steps taken before it); the publisher thread reads
them 20 times a second, between its publishes too, so that none is held long: a CPU loss at
once, CUDA losses stacked and copied back without waiting (`ReadBack`, on the stream current in
the publisher: the default one, where most training runs). The first step whose loss is NaN or
infinite is kept, and no loss after it. On the CPU a published step count S means every loss
of the steps before S was read in that publish.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from watchdog.hook.readback import ReadBack

# Losses waiting for the publisher thread (it reads them 20 times a second): enough for 50 us
# steps. Past it the oldest go unread, so a NaN there may be found a few steps late.
MAX_WAITING = 1024
# CUDA read-backs in flight. Past it the losses wait in `waiting` until the device catches up,
# rather than an older read-back, a NaN perhaps, be dropped unread: with reads 20 times a
# second, a device held busy fills them in 0.4 s.
MAX_READING = 8


class Losses:
    """The losses of one rank. The training thread appends to `waiting` while `watching`; the
    publisher thread calls `collect`."""

    __slots__ = ("_reading", "first", "waiting", "watching")

    def __init__(self) -> None:
        self.watching = False
        self.waiting: deque[tuple[int, Any]] = deque(maxlen=MAX_WAITING)
        self._reading: deque[tuple[list[int], ReadBack]] = deque()
        self.first = (-1, 0.0)  # the step of the first non-finite loss, and its value

    def collect(self, torch: Any) -> None:
        """Read what can be read by now."""
        while self._reading and self._reading[0][1].ready():
            steps, values = self._reading.popleft()
            self._found(steps, values.numbers())
        if len(self._reading) >= MAX_READING:
            return
        on_gpu: list[tuple[int, Any]] = []
        while self.waiting and self.first[0] < 0:
            step, loss = self.waiting.popleft()
            if loss.numel() != 1 or not loss.is_floating_point():
                continue
            if loss.device.type == "cpu":
                self._found([step], [loss.item()])
            elif loss.device.type == "cuda":
                on_gpu.append((step, loss))
        devices = {loss.device for _, loss in on_gpu}
        for device in devices:
            mine = [(step, loss) for step, loss in on_gpu if loss.device == device]
            with torch.no_grad():
                values = torch.stack([loss.detach().reshape(()).float() for _, loss in mine])
            self._reading.append(([step for step, _ in mine], ReadBack(torch, values)))

    def _found(self, steps: list[int], values: list[float]) -> None:
        for step, value in zip(steps, values, strict=True):
            if not math.isfinite(value) and (self.first[0] < 0 or step < self.first[0]):
                self.first = (step, value)
                self.watching = False
                self.waiting.clear()
