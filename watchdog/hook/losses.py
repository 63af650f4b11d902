"""The loss of every step, checked off the training thread (runs inside every training rank;
torch arrives as an argument).

The loss is the tensor backward() is called on. The training thread only keeps a reference to
it with the step it belongs to (the optimizer steps taken before it); the publisher thread reads
them 20 times a second, between its publishes too, so that none is held long: a CPU loss at
once, CUDA losses stacked and copied back without waiting (`ReadBack`, on the stream current in
the publisher: the default one, where most training runs). The first step whose loss is NaN or
infinite is kept, and no loss after it. On the CPU a published step count S means every loss
of the steps before S was read in that publish.

A loss read goes back to the training thread (`read`), whose next backward() drops it: the
loss holds its step's autograd graph, and freed by the publisher thread that memory is not what
the training thread's next steps allocate from (malloc keeps freed memory per thread, as we
read it): dropped there, 0.7-1.3 us more a step (median; two A/B runs of
tests/bench/hook_overhead.py's job, both ways in one run). A loss the training thread has not
taken by the next read round is dropped by the publisher.
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

    __slots__ = ("_reading", "first", "read", "waiting", "watching")

    def __init__(self) -> None:
        self.watching = False
        self.waiting: deque[tuple[int, Any]] = deque(maxlen=MAX_WAITING)
        self._reading: deque[tuple[list[int], ReadBack]] = deque()
        self.read: list[Any] = []  # read, for the training thread to drop
        self.first = (-1, 0.0)  # the step of the first non-finite loss, and its value

    def collect(self, torch: Any) -> None:
        """Read what can be read by now; the losses read go to `read`."""
        self.read.clear()  # the training thread called no backward() since the last round
        while self._reading and self._reading[0][1].ready():
            steps, values = self._reading.popleft()
            self._found(steps, values.numbers())
        if len(self._reading) >= MAX_READING:
            return
        on_gpu: list[tuple[int, Any]] = []
        while self.waiting and self.first[0] < 0:
            step, loss = self.waiting.popleft()
            self.read.append(loss)
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
                self.stop()

    def stop(self) -> None:
        """Keep no more losses, and none of those kept: nothing will read them."""
        self.watching = False
        self.waiting.clear()
        self.read.clear()
