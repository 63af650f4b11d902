"""Incident history, the same assertions on each backend (a SQLite file, a database on a real
PostgreSQL server: tests/helpers/postgres.py): stored text comes back byte for byte, each with
the coordinator that stored it; retention by count, age and bytes, with two coordinators
pruning at once; the schema migrated forward, a newer one refused. On PostgreSQL alone: the
password from a password file or the environment and never shown, TLS as the URL asks.

Here rather than in tests/unit: half of them need a PostgreSQL server, a daemon and a machine
with its binaries, which the unit tier never asks for (`pytest tests/integration/test_store.py
-k sqlite` is the quick loop for the file)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import postgres as pg
from tests.helpers.databases import execute
from watchdog.coordinator import postgres_store, sqlite_store
from watchdog.coordinator.database import POSTGRES, SQLITE, Database, mask
from watchdog.coordinator.postgres_store import PostgresStore
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.coordinator.store import IncidentStore, Retention, Stored, incident_json
from watchdog.errors import SchemaTooNewError, StoreUnavailableError

DAY = 86400.0
MakeStore = Callable[..., IncidentStore]


def incident(n: int, at: float) -> dict[str, Any]:
    return {"id": f"i{n}", "job_id": "job", "detected_at": at, "kind": "MISSING_RANKS",
            "summary": f"rank {n} never reached all_reduce #57 on group 0 (world) — ünïcode",
            "culprit_ranks": [n], "waiting_ranks": [], "collective": None, "ranks": [],
            "stack_groups": []}


def ids(store: IncidentStore) -> list[str]:
    return [json.loads(stored.text)["id"] for stored in store.listed()]


def together(count: int, work: Callable[[int, IncidentStore], object],
             make: Callable[[int], IncidentStore]) -> list[BaseException]:
    """`work` by `count` coordinators at once, each on a store of its own made first (they
    start together); what any of them raised."""
    failures: list[BaseException] = []
    ready = threading.Barrier(count)

    def coordinator(k: int) -> None:
        store = make(k)
        ready.wait()
        try:
            work(k, store)
        except BaseException as e:
            failures.append(e)
        store.close()

    threads = [threading.Thread(target=coordinator, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return failures


def test_text_survives_reopening_byte_for_byte(make_store: MakeStore) -> None:
    store = make_store()
    store.add(incident(1, 1000.0))
    before = store.get_json("i1")
    store.close()
    reopened = make_store()
    assert reopened.get_json("i1") == before == incident_json(incident(1, 1000.0))
    assert json.loads(reopened.listed()[0].text) == incident(1, 1000.0)


def test_adding_the_same_incident_twice_keeps_one(make_store: MakeStore) -> None:
    store = make_store()
    store.add(incident(1, 1000.0))
    store.add(incident(1, 1000.0))
    assert len(store.listed()) == 1


def test_adding_an_id_again_stores_its_newer_text_in_place(make_store: MakeStore) -> None:
    store = make_store()
    store.add(incident(1, 1000.0))
    store.add(incident(2, 1001.0))
    ended = {**incident(1, 1000.0), "ended_at": 1041.5}
    store.add(ended)
    assert store.get_json("i1") == incident_json(ended)
    assert ids(store) == ["i2", "i1"]


def test_each_incident_names_the_coordinator_that_stored_it_first(make_store: MakeStore) -> None:
    a, b = make_store(coordinator="head-a:29450"), make_store(coordinator="head-b:29450")
    a.add(incident(1, 1000.0))
    b.add(incident(2, 1001.0))
    ended = {**incident(1, 1000.0), "ended_at": 1041.5}
    b.add(ended)  # a standby storing an id again: the text is the newer, the name the first
    assert make_store().listed() == [Stored(incident_json(incident(2, 1001.0)), "head-b:29450"),
                                     Stored(incident_json(ended), "head-a:29450")]


def test_list_is_newest_first_and_retention_keeps_the_newest(make_store: MakeStore) -> None:
    store = make_store(retention=Retention(count=3, days=30))
    for n in range(5):
        store.add(incident(n, 1000.0 + n))
    assert ids(store) == ["i4", "i3", "i2"]


def test_retention_by_age(make_store: MakeStore) -> None:
    store = make_store(retention=Retention(count=100, days=7))
    store.add(incident(1, 10 * DAY))
    store.add(incident(2, 16 * DAY))
    store.add(incident(3, 18 * DAY))  # i1 is now 8 days old
    assert ids(store) == ["i3", "i2"]
    assert store.get_json("i1") is None


def big(n: int, at: float, size: int) -> dict[str, Any]:
    return {**incident(n, at), "log": "x" * size}


def test_retention_by_bytes_drops_the_oldest_first(make_store: MakeStore) -> None:
    store = make_store(retention=Retention(bytes=1 << 20))
    for n in range(64):  # 4 MiB in all
        store.add(big(n, 1000.0 + n, 64 << 10))
        assert store.used_bytes() <= 1 << 20
    kept = ids(store)
    assert 8 <= len(kept) < 16  # 16 of 64 KiB would fill 1 MiB alone
    assert kept == [f"i{n}" for n in range(63, 63 - len(kept), -1)]


def test_retention_by_bytes_never_drops_the_newest(make_store: MakeStore) -> None:
    store = make_store(retention=Retention(bytes=1 << 20))
    store.add(big(1, 1000.0, 64 << 10))
    store.add(big(2, 1001.0, 2 << 20))  # over the limit on its own
    assert ids(store) == ["i2"]
    store.add(big(3, 1002.0, 64 << 10))
    assert ids(store) == ["i3"]
    assert store.used_bytes() <= 1 << 20


def test_retention_by_bytes_drops_the_largest_owners_incidents_never_anothers(
        make_store: MakeStore) -> None:
    """One user's large incidents (issue 37, finding 7): root's older incident stays while
    nobody's take more bytes; the newest stays whoever owns it."""
    store = make_store(retention=Retention(bytes=1 << 20))
    store.add(big(0, 1000.0, 64 << 10), owner="0")
    for n in range(1, 40):  # 2.4 MiB of nobody's
        store.add(big(n, 1000.0 + n, 64 << 10), owner="65534")
        assert store.used_bytes() <= 1 << 20
    kept = ids(store)
    assert kept[0] == "i39" and kept[-1] == "i0" and 8 <= len(kept) < 16, kept
    store.add(big(40, 2000.0, 2 << 20), owner="65534")  # over the budget alone: kept, and
    assert ids(store) == ["i40", "i0"]  # the other owner's stays


def test_coordinators_pruning_one_database_at_once_fail_nothing(make_store: MakeStore) -> None:
    """Shards that store and prune at the same moment: every add succeeds, and the next prune
    leaves the newest `count`."""
    retention = Retention(count=20)
    make_store().open()  # the schema, before the race

    def coordinator(k: int, store: IncidentStore) -> None:
        for n in range(60):
            store.add(incident(n, 1000.0 + n + k / 10) | {"id": f"{k}-{n}"})

    failures = together(3, coordinator, lambda k: make_store(
        retention=retention, coordinator=f"c{k}", busy_timeout=10.0))
    last = make_store(retention=retention)
    last.add(incident(99, 2000.0))
    assert failures == []
    assert len(last.listed()) == 20 and ids(last)[0] == "i99"


# -- the schema: created, migrated forward, a newer one refused --------------------------------

@pytest.mark.parametrize("database", [POSTGRES], indirect=True)
def test_coordinators_opening_a_new_database_at_once_all_find_its_schema(
        database: Database, make_store: MakeStore) -> None:
    """Shards started together on an empty PostgreSQL database: one makes the schema, the
    others wait for it and find it made (the second of two coordinators once looked for the
    table in its session's catalog cache, did not see it yet, made it again and refused to
    start). SQLite's first open has a race of its own, not closed yet (docs/design.md)."""
    failures = together(4, lambda _, store: store.open(),
                        lambda k: make_store(coordinator=f"c{k}", busy_timeout=10.0))
    assert failures == []
    assert execute(database, "SELECT version FROM incidents_schema") == [
        (len(backend_of(database).MIGRATIONS),)]



def backend_of(database: Database) -> Any:
    return sqlite_store if database.kind == SQLITE else postgres_store


def test_a_database_one_version_behind_is_migrated_in_place(
        database: Database, make_store: MakeStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store()
    store.add(incident(1, 1000.0))
    store.close()
    backend = backend_of(database)
    step = ("CREATE TABLE incidents_note (id TEXT PRIMARY KEY, note TEXT NOT NULL)",)
    monkeypatch.setattr(backend, "MIGRATIONS", (*backend.MIGRATIONS, step))
    assert [json.loads(s.text)["id"] for s in make_store().listed()] == ["i1"]
    assert execute(database, "SELECT version FROM incidents_schema") == [
        (len(backend.MIGRATIONS),)]
    assert execute(database, "SELECT count(*) FROM incidents_note") == [(0,)]


def test_a_database_of_a_newer_release_is_refused_with_a_hint(
        database: Database, make_store: MakeStore) -> None:
    make_store().open()
    execute(database, "UPDATE incidents_schema SET version = 7")
    with pytest.raises(SchemaTooNewError) as refused:
        make_store().open()
    newest = len(backend_of(database).MIGRATIONS)
    assert (f"{database.shown} has schema version 7; this torch-hang-watchdog knows up to "
            f"{newest}") in str(refused.value)
    assert "hint: upgrade torch-hang-watchdog" in str(refused.value)


def test_a_file_of_the_releases_before_the_schema_had_versions_is_migrated(
        tmp_path: Path) -> None:
    path = tmp_path / "incidents.db"
    with sqlite3.connect(path) as old:  # what every earlier release made
        old.executescript(
            "CREATE TABLE incidents (id TEXT PRIMARY KEY, job_id TEXT NOT NULL, detected_at "
            "REAL NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL);"
            "CREATE INDEX incidents_detected ON incidents (detected_at);"
            "CREATE INDEX incidents_job ON incidents (job_id, detected_at);")
        old.execute("INSERT INTO incidents VALUES ('i1', 'job', 1000.0, 'MISSING_RANKS', ?)",
                    (incident_json(incident(1, 1000.0)),))
    old.close()
    store = SqliteStore(str(path), coordinator="head:29450")
    store.add(incident(2, 1001.0))
    assert store.listed() == [Stored(incident_json(incident(2, 1001.0)), "head:29450"),
                              Stored(incident_json(incident(1, 1000.0)), "")]
    assert execute(Database(SQLITE, str(path), str(path)),
                   "SELECT version FROM incidents_schema") == [(len(sqlite_store.MIGRATIONS),)]


# -- PostgreSQL's credentials and TLS ----------------------------------------------------------

def test_the_password_comes_from_a_password_file_or_the_environment_and_is_never_shown(
        postgres: pg.Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    for variable in ("PGPASSWORD", "PGPASSFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pgpass of the machine's
    url = postgres.database(user=pg.PASSWORD_USER)
    with pytest.raises(StoreUnavailableError) as refused:
        PostgresStore(url).open()
    assert "no password supplied" in str(refused.value) and "~/.pgpass" in str(refused.value)

    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{postgres.port}:*:{pg.PASSWORD_USER}:{pg.PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    PostgresStore(url).add(incident(1, 1000.0))
    monkeypatch.delenv("PGPASSFILE")
    monkeypatch.setenv("PGPASSWORD", pg.PASSWORD)
    assert len(PostgresStore(url).listed()) == 1
    monkeypatch.delenv("PGPASSWORD")

    with_password = url.replace(f"{pg.PASSWORD_USER}@", f"{pg.PASSWORD_USER}:{pg.PASSWORD}@")
    store = PostgresStore(with_password)  # as $WATCHDOG_DB may give it
    store.open()
    store.spill([incident(2, 1001.0)])
    assert store.where == mask(with_password) == url.replace("@", ":***@", 1)
    assert pg.PASSWORD not in store.spill_path and pg.PASSWORD not in " ".join(
        os.listdir(tmp_path / "state"))


def test_tls_is_what_the_url_asks_for(postgres: pg.Cluster, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    url = postgres.database().replace("sslmode=disable",
                                      f"sslmode=verify-full&sslrootcert={postgres.ca}")
    store = PostgresStore(url)
    store.add(incident(1, 1000.0))
    with postgres.admin() as admin:
        encrypted = admin.execute(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid "
            "WHERE a.application_name = 'torch-hang-watchdog' AND a.datname = %s",
            (pg.dbname(url),)).fetchall()
    assert encrypted == [(True,)]
    wrong_ca = url.replace(postgres.ca, "system")  # a CA that did not sign the server's
    with pytest.raises(StoreUnavailableError, match="certificate verify failed"):
        PostgresStore(wrong_ca).open()
