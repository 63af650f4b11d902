"""Incidents reach SQLite from a thread; a locked database delays them, loses none; files are
the owner's alone."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from watchdog.coordinator import Coordinator, StallPolicy
from watchdog.coordinator.persist import IncidentSaver
from watchdog.coordinator.store import IncidentStore
from watchdog.errors import WatchdogError


def incident(n: int) -> dict[str, Any]:
    return {"id": f"i{n}", "job_id": "job", "detected_at": 1000.0 + n, "kind": "RANK_EXITED",
            "summary": "rank 1 exited first"}


def locked(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def opened_then_locked(path: Path, busy_timeout: float = 0.05
                       ) -> tuple[IncidentStore, sqlite3.Connection]:
    """A store that opened its database, which another connection then locked."""
    store = IncidentStore(str(path), busy_timeout=busy_timeout)
    store.open()
    return store, locked(path)


def test_a_locked_database_keeps_incidents_in_order_until_it_frees(tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    store = IncidentStore(str(path), busy_timeout=0.05)
    store.open()

    async def scenario() -> list[bool]:
        saver = IncidentSaver(store)
        holder = locked(path)
        results = [await saver.save(incident(1)), await saver.save(incident(2))]
        assert [i["id"] for i in saver.pending] == ["i1", "i2"]
        holder.rollback()
        results.append(await saver.flush())
        await saver.close()
        return results

    assert asyncio.run(scenario()) == [False, False, True]
    assert [json.loads(t)["id"] for t in IncidentStore(str(path)).list_json()] == ["i2", "i1"]


def test_a_newer_text_saved_while_the_first_waits_is_the_one_kept(tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    store = IncidentStore(str(path), busy_timeout=0.05)
    store.open()
    ended = {**incident(1), "ended_at": 1041.0}

    async def scenario() -> None:
        saver = IncidentSaver(store)
        holder = locked(path)
        assert not await saver.save(incident(1))
        assert not await saver.save(ended)
        holder.rollback()
        assert await saver.flush()
        await saver.close()

    asyncio.run(scenario())
    assert [json.loads(t) for t in IncidentStore(str(path)).list_json()] == [ended]


def test_what_is_pending_at_close_is_stored_by_the_next_opener(tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    store, holder = opened_then_locked(path)

    async def scenario() -> None:
        saver = IncidentSaver(store)
        assert not await saver.save(incident(1))
        await saver.close()

    asyncio.run(scenario())
    spilled = Path(f"{path}.pending")
    assert spilled.stat().st_mode & 0o777 == 0o600
    holder.rollback()
    assert [json.loads(t)["id"] for t in IncidentStore(str(path)).list_json()] == ["i1"]
    assert not spilled.exists()


def test_the_database_and_its_companions_are_the_owners_alone(tmp_path: Path) -> None:
    path = tmp_path / "state" / "incidents.db"
    old = os.umask(0o022)
    try:
        store = IncidentStore(str(path))
        store.add(incident(1))
    finally:
        os.umask(old)
    assert path.parent.stat().st_mode & 0o777 == 0o700
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        assert name.stat().st_mode & 0o777 == 0o600, name
    store.close()
    path.chmod(0o644)  # left open by an older version: closed again on the next open
    IncidentStore(str(path)).open()
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_refused_incident_is_kept_aside_at_once_for_a_process_killed_before_close(
        tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    store, holder = opened_then_locked(path)

    async def scenario() -> None:
        saver = IncidentSaver(store)
        assert not await saver.save(incident(1))
        assert not await saver.save(incident(2))  # no close: as after a SIGKILL

    asyncio.run(scenario())
    holder.rollback()
    assert [json.loads(t)["id"] for t in IncidentStore(str(path)).list_json()] == ["i2", "i1"]
    assert not Path(f"{path}.pending").exists()


def test_an_incident_the_database_refuses_is_kept_aside_before_it_is_told(
        tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    # A busy timeout longer than the wait before telling:
    store, holder = opened_then_locked(path, busy_timeout=1.5)
    hub = Coordinator(store, StallPolicy())

    async def told() -> bool:
        await hub._store(incident(1))  # what `_announce` awaits before it tells anyone
        kept = Path(f"{path}.pending").exists()
        await hub.saver.close()
        return kept

    try:
        assert asyncio.run(told())
    finally:
        holder.rollback()


def test_a_directory_given_as_the_database_keeps_its_mode(tmp_path: Path) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir(mode=0o755)
    with pytest.raises(WatchdogError):
        IncidentStore(str(directory)).open()
    assert directory.stat().st_mode & 0o777 == 0o755  # once, "/" was made 0600
