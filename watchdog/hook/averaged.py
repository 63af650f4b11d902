"""Gradients averaged outside DDP (runs inside every training rank; torch arrives as an argument).

A loop that averages its gradients by hand (`dist.all_reduce(p.grad)` for each parameter, or
of a flat buffer its gradients are views of) keeps the replicas of those parameters equal across
the group, as DDP does; so does FSDP2's HSDP, whose sharded gradients are views of the buffer it
all-reduces over the replicate dimension. In the step before a check the all_reduce wrapper
hands each tensor it reduces here (`add`); after the optimizer step the check asks which of the
optimizer's parameters have their gradient inside one of those tensors (`averaged`). A
parameter all-reduced itself (local SGD averages weights on purpose) has no gradient there.
"""

from __future__ import annotations

import bisect
from typing import Any

MAX_REDUCED = 4096  # tensors remembered in one step (one per parameter in the tutorial's loop)


class Reduced:
    """The tensors all-reduced since the step before a check, with their process groups. They
    are kept alive until the check: memory freed meanwhile could hold a gradient by then."""

    __slots__ = ("_tensors",)

    def __init__(self) -> None:
        self._tensors: list[tuple[Any, Any]] = []

    def add(self, tensor: Any, group: Any) -> None:
        if len(self._tensors) < MAX_REDUCED:
            self._tensors.append((tensor, group))

    def clear(self) -> None:
        self._tensors.clear()

    def averaged(self, dist: Any, optimizer: Any) -> dict[str, list[Any]]:
        """The parameters `optimizer` steps whose gradients lie inside a reduced tensor, by the
        name of that tensor's process group, in the optimizer's order (the same on every
        rank)."""
        spans = sorted((*span, _name(dist, group)) for t, group in self._tensors
                       if (span := _span(t)) is not None)
        starts = [start for start, _, _ in spans]
        found: dict[str, list[Any]] = {}
        for param_group in optimizer.param_groups:
            for p in param_group["params"]:
                grad = _span(p.grad) if p.grad is not None else None
                at = bisect.bisect_right(starts, grad[0]) - 1 if grad is not None else -1
                if grad is not None and at >= 0 and grad[1] <= spans[at][1]:
                    found.setdefault(spans[at][2], []).append(p)
        return found


def _span(tensor: Any) -> tuple[int, int] | None:
    """The bytes a dense tensor (a DTensor's local shard) spans; None for one that has no such
    bytes (sparse, meta, empty)."""
    t = getattr(tensor, "_local_tensor", tensor)
    if str(t.layout) != "torch.strided" or t.device.type == "meta" or not t.numel():
        return None
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _name(dist: Any, group: Any) -> str:
    return str((dist.group.WORLD if group is None else group).group_name)
