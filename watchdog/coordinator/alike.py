"""Ranks alike, as ranges (coordinator process, and any reader of an incident): a large job's
incident and status list their culprits and outliers in full and every other rank in a group of
ranks that share one state, step, last collective and stack, so that their size follows the
number of distinct behaviours, not the number of ranks.

A group names its ranks as inclusive [first, last] ranges; `rank_in` answers "what was rank
90,211 doing" from the full rows and the groups alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from watchdog.schema import RankTable


def ranges(ranks: Iterable[int]) -> list[list[int]]:
    """[[0, 3], [5, 5]] for 0,1,2,3,5: sorted, inclusive runs."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return runs


def in_ranges(rank: int, runs: Sequence[Sequence[int]]) -> bool:
    return any(first <= rank <= last for first, last in runs)


def rank_in(table: RankTable, rank: int) -> Mapping[str, object] | None:
    """Rank `rank`'s row in an incident or a status job (`table`): its full row, or the group
    it belongs to (with `rank` set); None when neither lists it."""
    for row in table.get("ranks") or ():
        if isinstance(row, Mapping) and row.get("rank") == rank:
            return row
    for group in table.get("rank_groups") or ():
        if isinstance(group, Mapping) and in_ranges(rank, group.get("ranks") or ()):
            return {**group, "rank": rank}
    return None
