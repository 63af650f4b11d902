"""What the ranks of one snapshot say of their process groups (coordinator process): each group's
members, the furthest collective a live member entered, and which collective a rank waits in
that another never entered. Every group is read in one pass over the ranks, once a snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from watchdog.model import WORLD_GROUP, CollectiveRef, JobSnapshot, RankState


def furthest_entered(snapshot: JobSnapshot) -> Mapping[str, int]:
    """Per group, the furthest collective any live rank entered."""
    return _groups(snapshot).furthest


def awaited_collective(
    snapshot: JobSnapshot, peer: RankState, gone: RankState
) -> CollectiveRef | None:
    """The collective `peer` waits in that `gone`, a member of its group, never entered."""
    for progress in peer.groups:
        members = group_members(snapshot, progress.group)
        reached = gone.group(progress.group)
        behind = reached is None or reached.entered_seq < progress.entered_seq
        if progress.pending and gone.rank in members and behind:
            return CollectiveRef(progress.group, members, progress.entered_seq, progress.entered_op)
    return None


def group_members(snapshot: JobSnapshot, group: str) -> tuple[int, ...]:
    """The ranks the group's members list, and every rank that has the group itself: a beacon
    lists only the first MAX_LISTED_RANKS members of a group."""
    groups = _groups(snapshot)
    members = groups.members.get(group)
    if members is None:
        declared = groups.declared.get(group, set())
        if not declared and group == WORLD_GROUP:
            members = tuple(range(snapshot.world_size))
        else:
            members = tuple(sorted(declared.union(groups.having.get(group, ()))))
        groups.members[group] = members
    return members


@dataclass
class _Groups:
    """What the ranks of one snapshot say of their process groups, read in one pass."""

    furthest: dict[str, int]  # the furthest collective a live rank entered
    having: dict[str, list[int]]  # the ranks that report the group
    declared: dict[str, set[int]]  # the members they list
    members: dict[str, tuple[int, ...]]  # `group_members`, once asked


def _groups(snapshot: JobSnapshot) -> _Groups:
    made: _Groups | None = snapshot.derived.get("groups")
    if made is None:
        made = snapshot.derived["groups"] = _Groups({}, {}, {}, {})
        for rank in snapshot.ranks:
            alive = rank.alive
            for progress in rank.groups:
                name = progress.group
                made.having.setdefault(name, []).append(rank.rank)
                if progress.ranks:
                    made.declared.setdefault(name, set()).update(progress.ranks)
                if alive and progress.entered_seq > made.furthest.get(name, 0):
                    made.furthest[name] = progress.entered_seq
    return made
