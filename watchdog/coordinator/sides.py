"""Which ranks are the odd ones out, of ranks that should all agree (coordinator process; pure)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping


def replica_culprits(digests: Mapping[int, Hashable]) -> tuple[int, ...]:
    """The ranks whose value (a replica's digest, a version) differs from the most common one.
    Ties: the side that holds the lowest rank, where rank-0-only code lives; when no two ranks
    agree, every rank."""
    sides: dict[Hashable, list[int]] = {}
    for rank in sorted(digests):
        sides.setdefault(digests[rank], []).append(rank)
    if len(sides) < 2:
        return ()
    if all(len(side) == 1 for side in sides.values()):
        return tuple(sorted(digests))
    lowest = min(digests)
    reference = max(sides.values(), key=lambda side: (len(side), lowest not in side))
    return tuple(rank for rank in sorted(digests) if rank not in reference)
