"""Where the web view's pages come from (coordinator process): the live coordinator's status,
taken on its own event loop, and its incident database, read from the web view's threads
through a connection of their own (SQLite in WAL mode lets them read while the coordinator
writes; PostgreSQL serves any number of connections)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json

from watchdog.coordinator import Coordinator, store_for
from watchdog.coordinator.database import Database
from watchdog.model import EVERY_JOB, StatusQuery
from watchdog.schema import Incident, Status

STATUS_TIMEOUT_S = 10.0


class CoordinatorSource:
    def __init__(self, coordinator: Coordinator, loop: asyncio.AbstractEventLoop,
                 database: Database) -> None:
        self._coordinator = coordinator
        self._loop = loop
        self._database = database

    def status(self, query: StatusQuery = EVERY_JOB) -> Status:
        """Called from a web view thread; TimeoutError when the loop is too busy to answer."""
        future = asyncio.run_coroutine_threadsafe(self._status_json(query), self._loop)
        try:
            text = future.result(timeout=STATUS_TIMEOUT_S)
        except concurrent.futures.TimeoutError:  # not the builtin one before Python 3.11
            future.cancel()
            raise TimeoutError("the coordinator's event loop did not answer") from None
        status: Status = json.loads(text)
        return status

    async def _status_json(self, query: StatusQuery) -> str:
        return self._coordinator.status_json(query)

    def incident(self, incident_id: str) -> Incident | None:
        with contextlib.closing(store_for(self._database)) as store:
            body = store.get_json(incident_id)
        incident: Incident | None = None if body is None else json.loads(body)
        return incident

    def incidents(self, limit: int) -> list[tuple[Incident, str]]:
        """The newest incidents, each with the coordinator that stored it."""
        with contextlib.closing(store_for(self._database)) as store:
            return [(json.loads(s.text), s.coordinator) for s in store.listed(limit)]
