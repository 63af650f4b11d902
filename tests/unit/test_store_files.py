"""The files the incident store makes are the owner's alone: a SQLite database with its WAL and
shared-memory files, and the spill file where refused incidents wait (for a PostgreSQL URL, in
the state directory, named after the database, never its password); a directory given as the
database keeps its mode. No server needed: a spill file is written without one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from watchdog.coordinator.postgres_store import PostgresStore
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.errors import WatchdogError

INCIDENT = {"id": "i1", "job_id": "job", "detected_at": 1001.0, "kind": "RANK_EXITED",
            "summary": "rank 1 exited first"}


def test_the_database_and_its_companions_are_the_owners_alone(tmp_path: Path) -> None:
    path = tmp_path / "state" / "incidents.db"
    old = os.umask(0o022)
    try:
        store = SqliteStore(str(path))
        store.add(INCIDENT)
    finally:
        os.umask(old)
    assert path.parent.stat().st_mode & 0o777 == 0o700
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        assert name.stat().st_mode & 0o777 == 0o600, name
    store.close()
    path.chmod(0o644)  # left open by an older version: closed again on the next open
    SqliteStore(str(path)).open()
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_directory_given_as_the_database_keeps_its_mode(tmp_path: Path) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir(mode=0o755)
    with pytest.raises(WatchdogError):
        SqliteStore(str(directory)).open()
    assert directory.stat().st_mode & 0o777 == 0o755  # once, "/" was made 0600


def test_a_urls_spill_file_is_in_the_state_directory_named_without_the_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", f"{state}:{tmp_path / 'second'}")
    old = os.umask(0o022)
    try:
        store = PostgresStore("postgresql://watchdog:hunter2@db.example:5433/incidents"
                              "?sslmode=verify-full", coordinator="head:29450")
        store.spill([INCIDENT], {INCIDENT["id"]: "1000"})
    finally:
        os.umask(old)
    spilled = Path(store.spill_path)
    assert spilled == state / "pg-watchdog@db.example-5433-incidents.pending"
    assert state.stat().st_mode & 0o777 == 0o700 and spilled.stat().st_mode & 0o777 == 0o600
    assert json.loads(spilled.read_text()) == {"coordinator": "head:29450", "incident": INCIDENT,
                                               "owner": "1000"}
    assert store.where == "postgresql://watchdog:***@db.example:5433/incidents?sslmode=verify-full"


def test_a_spill_file_of_an_earlier_release_is_stored_unnamed(tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    Path(f"{path}.pending").write_text(json.dumps(INCIDENT) + "\n")  # bare incidents, a line each
    store = SqliteStore(str(path), coordinator="head:29450")
    assert [(json.loads(s.text), s.coordinator) for s in store.listed()] == [(INCIDENT, "")]
    assert not Path(f"{path}.pending").exists()
