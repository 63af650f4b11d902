"""Ranks that behave alike, as one row (CLI and coordinator processes, stdlib only).

Thousands of ranks stay readable because most of them do the same thing: the same state, the
same last collective, the same stack. The finest grouping that fits in `limit` rows is used;
culprits never share a row with ranks that are not.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass

from watchdog.frames import stack_signature
from watchdog.model import Frame
from watchdog.report.stack_tree import frames_of
from watchdog.schema import RankRow
from watchdog.text import ranks_text

Row = RankRow
MAX_GROUPS = 40


@dataclass
class RowGroup:
    rows: list[Row]
    culprit: bool
    frames: tuple[Frame, ...]  # the first member's stack

    @property
    def ranks(self) -> list[int]:
        return [int(row["rank"]) for row in self.rows]

    @property
    def first(self) -> Row:
        return self.rows[0]

    @property
    def label(self) -> str:
        return ranks_text(self.ranks)

    def hosts(self) -> str:
        """'node-a', 'node-a, node-b', or '512 hosts (node-000 … node-511)'."""
        names = sorted({str(row.get("host", "")) for row in self.rows})
        if len(names) <= 3:
            return ", ".join(names)
        return f"{len(names)} hosts ({names[0]} … {names[-1]})"

    @property
    def oldest_heartbeat(self) -> float | None:
        ages = [age for row in self.rows
                if isinstance(age := row.get("heartbeat_age"), int | float)]
        return max(ages) if ages else None

    @property
    def steps_vary(self) -> bool:
        return len({repr(row.get("step")) for row in self.rows}) > 1


def last_collective_key(row: Row) -> tuple[object, ...]:
    last = row.get("last_collective")
    if not isinstance(last, Mapping):
        return ()
    return (last.get("group"), last.get("op"), last.get("seq"), last.get("completed"))


def _levels(stacks: Mapping[int, Hashable]) -> list[Callable[[Row], Hashable]]:
    """Grouping keys from the finest to the coarsest (the culprit flag is added to each)."""

    def stack(row: Row) -> Hashable:
        return stacks.get(int(row["rank"]))

    return [
        lambda r: (r.get("state"), r.get("step"), last_collective_key(r), stack(r),
                   r.get("exit_code")),
        lambda r: (r.get("state"), last_collective_key(r), stack(r)),
        lambda r: (r.get("state"), last_collective_key(r)[:2]),
        lambda r: r.get("state"),
    ]


def group_ranks(rows: Sequence[Row], culprits: Collection[int],
                limit: int = MAX_GROUPS) -> list[RowGroup]:
    """Rows grouped by behaviour: culprits' groups first, then by their lowest rank."""
    ordered = sorted(rows, key=lambda r: int(r["rank"]))
    frames = {int(r["rank"]): frames_of(r) for r in ordered}
    signatures = {rank: stack_signature(f) for rank, f in frames.items()}
    groups: dict[tuple[bool, Hashable], list[Row]] = {}
    for level in _levels(signatures):
        groups = {}
        for row in ordered:
            groups.setdefault((int(row["rank"]) in culprits, level(row)), []).append(row)
        if len(groups) <= limit:
            break
    found = [RowGroup(members, culprit, frames[int(members[0]["rank"])])
             for (culprit, _), members in groups.items()]
    return sorted(found, key=lambda g: (not g.culprit, g.ranks[0]))
