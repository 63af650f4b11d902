"""Incidents reach the database from a thread, and none is lost while it fails (coordinator
process).

A database blocks: SQLite on a locked file for its whole busy timeout, PostgreSQL on a server
that is slow to answer. The event loop never waits for it: every call runs in one thread of
its own. An incident the database refuses is kept, in order, and stored when the database works
again (retried every RETRY_S); meanwhile it is printed and acted on like any other. It is also
written at once to the store's spill file (`IncidentStore.spill`), which the next process to
open the database stores: a coordinator killed while the database fails loses none of what it
printed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from watchdog.coordinator.store import IncidentStore, first_line
from watchdog.errors import WatchdogError
from watchdog.schema import Incident

log = logging.getLogger(__name__)

RETRY_S = 2.0
_FAILURES = (OSError, WatchdogError)
T = TypeVar("T")


class IncidentSaver:
    def __init__(self, store: IncidentStore) -> None:
        self.store = store
        self.pending: list[Incident] = []  # oldest first
        self.owners: dict[str, str] = {}  # of the pending incidents, by id (IncidentStore.add)
        self._aside = 0  # how many of `pending`, from the oldest, are in the spill file
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="incident-db")
        self._lock = asyncio.Lock()
        self._failing = False
        self._told: Unstored | None = None  # what `settle` last logged

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def save(self, incident: Incident, owner: str = "") -> bool:
        """Store `incident` of `owner` (after any still pending); True once it is stored, False
        when the database failed and it waits for the next retry."""
        self.pending.append(incident)
        self.owners[incident["id"]] = owner
        return await self.flush()

    async def flush(self) -> bool:
        """Store what is pending, oldest first; True when nothing is left."""
        async with self._lock:
            while self.pending:
                try:
                    await self._store_first()
                except _FAILURES as e:
                    if not self._failing:
                        log.error("cannot store incidents in %s: %s; keeping them and retrying "
                                  "every %.0fs", self.store.where, first_line(e), RETRY_S)
                    self._failing = True
                    await self._keep_aside()
                    return False
            if self._failing:
                log.info("the incident database %s works again: stored what was pending",
                         self.store.where)
                self._failing = False
            return True

    async def _store_first(self) -> None:
        """Store the oldest pending incident; those kept aside all at once, from their file
        (whoever opened the database since may have stored them already)."""
        if self._aside:
            await self._call(self.store.take_spilled)
            del self.pending[:self._aside]
            self._aside = 0
        else:
            first = self.pending[0]
            await self._call(self.store.add, first, self.owners.get(first["id"], ""))
            self.pending.pop(0)
        waiting = {incident["id"] for incident in self.pending}
        self.owners = {i: owner for i, owner in self.owners.items() if i in waiting}

    async def _keep_aside(self) -> None:
        """Write what is pending and not yet in the spill file there, so that a SIGKILL, which
        leaves no time for `close`, loses none of it."""
        if len(self.pending) == self._aside:
            return
        try:
            await self._call(self.store.spill, self.pending[self._aside:], self.owners)
        except OSError as e:  # the disk is full, say: still pending in memory and retried
            log.warning("cannot keep incidents aside in %s: %s", self.store.spill_path, e)
            return
        self._aside = len(self.pending)

    async def latest_json(self, job_id: str, kinds: Collection[str]) -> str | None:
        """The newest stored incident of a job among those of `kinds`; None when there is none
        or it cannot be read."""
        return await self._read(None, self.store.latest_json, job_id, kinds)

    async def kind_json(self, job_id: str, kind: str) -> list[str]:
        """Every stored incident of one kind in a job, newest first; [] when they cannot be
        read."""
        return await self._read([], self.store.kind_json, job_id, kind)

    async def _read(self, failed: T, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._call(fn, *args)
        except _FAILURES as e:
            log.warning("cannot read %s: %s", self.store.where, first_line(e))
            return failed

    async def retry_until(self, stop: asyncio.Event) -> None:
        """Store what the database refused, every RETRY_S, until `stop`."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), RETRY_S)
            except TimeoutError:
                if self.pending:
                    await self.flush()

    async def settle(self) -> Unstored | None:
        """One last try for what is pending; None when every incident is stored, else how many
        are not and where they are kept (the spill file, which the next opener stores from, or
        nowhere but memory when that cannot be written either). Logged once per count."""
        if not self.pending or await self.flush():
            return None
        kept = self.store.spill_path if self._aside == len(self.pending) else None
        unstored = Unstored(len(self.pending), kept)
        if unstored != self._told:
            self._told = unstored
            log.error("%d incidents could not be stored in %s%s", unstored.count,
                      self.store.where, f" yet: kept in {kept}, stored the next time it opens"
                      if kept else ", nor kept aside: they are lost when this process ends")
        return unstored

    async def close(self) -> None:
        """`settle` (unless nothing changed since it was told), then let go of the database."""
        if self._told is None or self._told.count != len(self.pending):
            await self.settle()
        await self._call(self.store.close)
        self._executor.shutdown(wait=True)


@dataclass(frozen=True)
class Unstored:
    """Incidents the database refused: how many, and the spill file they wait in (None: in
    memory only)."""

    count: int
    kept: str | None
