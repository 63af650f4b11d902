"""Which beacon slot a torch.distributed call counts on (runs inside every training rank).

A collective counts on its process group's slot; a point-to-point transfer on a slot of its own
per pair of ranks: counted on the group, it would put the members that take no part in it
behind by one.
"""

from __future__ import annotations

from typing import Any

from watchdog.hook.recorder import NO_GROUP, Recorder

MAX_CACHED_SLOTS = 256  # bounds memory when a job creates groups without end


class GroupSlots:
    """The process group -> beacon slot cache that the patches share.

    A key is the group argument as passed (None for the default group); a point-to-point key
    also holds the peer. Keys hold their groups alive, hence the bound. The wrappers of the
    calls made in every step read `cache` themselves: one dict lookup, no call.
    """

    def __init__(self, recorder: Recorder) -> None:
        self._rec = recorder
        self._dist: Any = None
        self.cache: dict[object, int] = {}

    def attach(self, dist: Any) -> None:
        """Look groups up in `dist` (torch.distributed), once it is imported."""
        self._dist = dist

    def rejoin(self) -> None:
        """The process group is (re)initialised: forget every slot, and show the world group in
        the beacon at seq 0, before any collective."""
        self.cache.clear()
        self._rec.ddp_group = NO_GROUP  # a group of the old one would name a slot of the old one
        self.slot(None)

    def slot(self, group: object) -> int:
        """The beacon slot of a process group; -1 when there is nothing to record in it."""
        slot = self.cache.get(group)
        return self.register(group, group, None) if slot is None else slot

    def pair_slot(self, group: object, peer: int | None, group_peer: int | None) -> int:
        """The slot counting point-to-point calls between this rank and one peer of `group`,
        named by its global rank or its rank in `group`; -1 for a receive from any source."""
        key = (group, peer, group_peer)
        slot = self.cache.get(key)
        if slot is None:
            slot = -1 if peer is None and group_peer is None else self.register(
                key, group, (peer, group_peer))
        return slot

    def register(self, key: object, group: object,
                 peer: tuple[int | None, int | None] | None) -> int:
        """The slot of `group` (of this rank and `peer` in it, if given), cached under `key`."""
        dist, writer, identity = self._dist, self._rec.writer, self._rec.identity
        if dist is None or writer is None or identity is None or not dist.is_initialized():
            return -1  # torch raises its own error for this call; try again on the next
        try:
            slot = -1
            if group != dist.GroupMember.NON_GROUP_MEMBER:
                pg: Any = dist.group.WORLD if group is None else group
                name, ranks = pg.group_name, tuple(dist.get_process_group_ranks(pg))
                if peer is not None:
                    other = peer[0] if peer[0] is not None else dist.get_global_rank(pg, peer[1])
                    ranks = tuple(sorted((dist.get_rank(), other)))
                    name = f"{name}:p2p:{ranks[0]}-{ranks[1]}"
                slot = writer.group_slot(name, ranks, identity.world_size)
        except Exception as e:
            self._rec.fail(e)
            return -1
        if len(self.cache) >= MAX_CACHED_SLOTS:
            self.cache.clear()
        self.cache[key] = slot
        return slot
