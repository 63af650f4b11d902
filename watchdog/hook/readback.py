"""Numbers computed on the training thread, read by the publisher thread once they are readable
(runs inside every training rank; torch arrives as an argument): on a GPU they are copied to
pinned memory without waiting, behind a CUDA event the publisher polls, so no thread waits for
the device."""

from __future__ import annotations

from typing import Any


class ReadBack:
    """A tensor's values, readable (`ready`) on the host."""

    __slots__ = ("event", "values")

    def __init__(self, torch: Any, values: Any) -> None:
        self.event = None
        if values.device.type == "cuda":
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(values.device))
            values = host
        self.values = values

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def numbers(self) -> list[float]:
        """The values as Python floats; call it once `ready`."""
        numbers: list[float] = self.values.tolist()
        return numbers
