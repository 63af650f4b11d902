"""Incidents reach the database from a thread: a database that refuses writers (a SQLite file
locked, a PostgreSQL table locked, a PostgreSQL server stopped) delays them and loses none, on
each backend (tests/integration/conftest.py: `database`, `make_store`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import postgres as pg
from tests.helpers.databases import hold_writers
from watchdog.coordinator import Coordinator, StallPolicy
from watchdog.coordinator.database import Database
from watchdog.coordinator.persist import IncidentSaver
from watchdog.coordinator.postgres_store import PostgresStore
from watchdog.coordinator.store import IncidentStore

MakeStore = Callable[..., IncidentStore]


def incident(n: int) -> dict[str, Any]:
    return {"id": f"i{n}", "job_id": "job", "detected_at": 1000.0 + n, "kind": "RANK_EXITED",
            "summary": "rank 1 exited first"}


def stored_ids(make_store: MakeStore) -> list[str]:
    return [json.loads(stored.text)["id"] for stored in make_store().listed()]


def opened(make_store: MakeStore, busy_timeout: float = 0.05) -> IncidentStore:
    store = make_store(busy_timeout=busy_timeout)
    store.open()
    return store


def test_a_locked_database_keeps_incidents_in_order_until_it_frees(
        database: Database, make_store: MakeStore) -> None:
    store = opened(make_store)

    async def scenario() -> list[bool]:
        saver = IncidentSaver(store)
        holder = hold_writers(database)
        results = [await saver.save(incident(1)), await saver.save(incident(2))]
        assert [i["id"] for i in saver.pending] == ["i1", "i2"]
        holder.rollback()
        results.append(await saver.flush())
        await saver.close()
        return results

    assert asyncio.run(scenario()) == [False, False, True]
    assert stored_ids(make_store) == ["i2", "i1"]


def test_a_newer_text_saved_while_the_first_waits_is_the_one_kept(
        database: Database, make_store: MakeStore) -> None:
    store = opened(make_store)
    ended = {**incident(1), "ended_at": 1041.0}

    async def scenario() -> None:
        saver = IncidentSaver(store)
        holder = hold_writers(database)
        assert not await saver.save(incident(1))
        assert not await saver.save(ended)
        holder.rollback()
        assert await saver.flush()
        await saver.close()

    asyncio.run(scenario())
    assert [json.loads(stored.text) for stored in make_store().listed()] == [ended]


def test_what_is_pending_at_close_is_stored_by_the_next_opener(
        database: Database, make_store: MakeStore) -> None:
    store = opened(make_store)
    holder = hold_writers(database)

    async def scenario() -> None:
        saver = IncidentSaver(store)
        assert not await saver.save(incident(1))
        await saver.close()

    asyncio.run(scenario())
    spilled = Path(store.spill_path)
    assert spilled.stat().st_mode & 0o777 == 0o600
    holder.rollback()
    assert stored_ids(make_store) == ["i1"]
    assert not spilled.exists()


def test_a_refused_incident_is_kept_aside_at_once_for_a_process_killed_before_close(
        database: Database, make_store: MakeStore) -> None:
    store = opened(make_store)
    holder = hold_writers(database)

    async def scenario() -> None:
        saver = IncidentSaver(store)
        assert not await saver.save(incident(1))
        assert not await saver.save(incident(2))  # no close: as after a SIGKILL

    asyncio.run(scenario())
    holder.rollback()
    assert stored_ids(make_store) == ["i2", "i1"]
    assert not Path(store.spill_path).exists()


def test_an_incident_the_database_refuses_is_kept_aside_before_it_is_told(
        database: Database, make_store: MakeStore) -> None:
    # A busy timeout longer than the wait before telling:
    store = opened(make_store, busy_timeout=1.5)
    holder = hold_writers(database)
    hub = Coordinator(store, StallPolicy())

    async def told() -> bool:
        await hub._store(incident(1))  # what `_announce` awaits before it tells anyone
        kept = Path(store.spill_path).exists()
        await hub.saver.close()
        return kept

    try:
        assert asyncio.run(told())
    finally:
        holder.rollback()


def test_a_stopped_server_keeps_incidents_aside_and_they_are_stored_once_it_is_back(
        postgres: pg.Cluster, tmp_path: Path, monkeypatch: Any) -> None:
    """The server stops and starts again under a coordinator's open connection: what it
    refused meanwhile is spilled, then stored, in order, once a retry finds it back."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    url = postgres.database()
    store = PostgresStore(url, coordinator="head:29450")
    store.open()

    async def scenario() -> list[bool]:
        saver = IncidentSaver(store)
        results = [await saver.save(incident(1))]
        postgres.stop()
        try:
            results += [await saver.save(incident(2)), await saver.save(incident(3))]
            assert Path(store.spill_path).exists()
        finally:
            postgres.start()
        results.append(await saver.flush())
        await saver.close()
        return results

    assert asyncio.run(scenario()) == [True, False, False, True]
    reader = PostgresStore(url)
    assert [(json.loads(s.text)["id"], s.coordinator) for s in reader.listed()] == [
        ("i3", "head:29450"), ("i2", "head:29450"), ("i1", "head:29450")]
    assert not Path(store.spill_path).exists()
