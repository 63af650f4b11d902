"""What was made of stacks, kept while it fits a budget (coordinator process).

The ranks of a large job share a few stacks, and what is made of each (its decoded frames, what
the verdict reads from them) is kept and reused. A table keeps entries while their costs (bytes
or frames of their stacks) add up to at most `budget`; past it, it starts again, so that an
agent sending distinct deep stacks one after another never makes the coordinator hold more than
the budget once the diagnosis that read them is over.
"""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedTable(Generic[K, V]):
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.cost = 0  # of the entries kept now
        self._table: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self._table.get(key)

    def put(self, key: K, value: V, cost: int) -> V:
        """Keep `value` at `cost`; returns it."""
        if self.cost + cost > self.budget:
            self._table.clear()
            self.cost = 0
        self._table[key] = value
        self.cost += cost
        return value
