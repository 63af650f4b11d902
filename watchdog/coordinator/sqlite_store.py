"""Incidents in a SQLite file (`IncidentStore`'s default backend): what `watchdog run` and one
coordinator need, with nothing else to run. Incidents the database refused wait in
`<db>.pending`, beside it."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Collection, Iterator
from pathlib import Path

from watchdog.coordinator import nolinks
from watchdog.coordinator.store import (
    DEFAULT_RETENTION,
    SCHEMA_TABLE,
    IncidentStore,
    Retention,
    Stored,
    refused_as,
)
from watchdog.errors import StoreError
from watchdog.schema import Incident

log = logging.getLogger(__name__)

# Step N takes the schema from version N to N + 1 (`IncidentStore._migrate`).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the table of the releases that recorded no version (a database may hold it already),
    # with the coordinator that stored each incident.
    ("CREATE TABLE IF NOT EXISTS incidents (id TEXT PRIMARY KEY, job_id TEXT NOT NULL, "
     "detected_at REAL NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL)",
     "CREATE INDEX IF NOT EXISTS incidents_detected ON incidents (detected_at)",
     "CREATE INDEX IF NOT EXISTS incidents_job ON incidents (job_id, detected_at)",
     "ALTER TABLE incidents ADD COLUMN coordinator TEXT NOT NULL DEFAULT ''"),
    # 2: the user whose ranks each incident names: the unit of the byte budget's eviction.
    ("ALTER TABLE incidents ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
     "CREATE INDEX IF NOT EXISTS incidents_owner ON incidents (owner, detected_at)"),
)
# An incident's bytes as stored (LENGTH of TEXT counts characters).
_BYTES = "LENGTH(CAST(body AS BLOB))"
_NEWEST = "(SELECT id FROM incidents ORDER BY detected_at DESC, id DESC LIMIT 1)"
# SQLite's "file is not a database" and "database disk image is malformed".
_DAMAGED = (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)


class SqliteStore(IncidentStore):
    """The database, its WAL and shared-memory files are the owner's alone (0600): incidents
    hold every rank's stacks and log lines. A locked database fails after `busy_timeout`
    seconds. `Retention.bytes` bounds the database's pages in use."""

    def __init__(self, path: str, retention: Retention = DEFAULT_RETENTION,
                 busy_timeout: float = 1.0, coordinator: str = "") -> None:
        super().__init__(retention, coordinator)
        self.path = self.where = path
        self.spill_path = f"{path}.pending"
        self.busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        self._ready()
        return self._connection()

    def _connect(self) -> None:
        self._connection()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            try:
                conn = self._open_connection()
            except sqlite3.DatabaseError as e:
                if e.sqlite_errorcode not in _DAMAGED:
                    raise
                self._move_aside(e)
                conn = self._open_connection()
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the incident database {self.path}: {e}",
                             hint="pass --db PATH to a writable location") from e
        return conn

    def _open_connection(self) -> sqlite3.Connection:
        _make_private(self.path)
        self._conn = sqlite3.connect(self.path, isolation_level=None,
                                     timeout=self.busy_timeout, check_same_thread=False)
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._migrate(MIGRATIONS)
        except (sqlite3.Error, StoreError):
            self._conn.close()
            self._conn = None
            raise
        return self._conn

    def _move_aside(self, error: sqlite3.DatabaseError) -> None:
        """A damaged database is kept, renamed, for whoever wants to rescue it, and a new one
        takes its place: refusing to start would make a supervised coordinator a crash loop
        that stores nothing at all."""
        aside = f"{self.path}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
        for suffix in ("", "-wal", "-shm"):
            try:
                os.rename(self.path + suffix, aside + suffix)
            except FileNotFoundError:
                continue
        log.error("the incident database %s is damaged (%s): moved aside to %s; storing "
                  "incidents in a new one", self.path, error, aside)

    def _schema_version(self) -> int:
        conn = self._connection()
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                        (SCHEMA_TABLE,)).fetchone() is None:
            return 0
        (version,) = conn.execute(f"SELECT max(version) FROM {SCHEMA_TABLE}").fetchone()
        return int(version or 0)

    @contextlib.contextmanager
    def _schema_lock(self) -> Iterator[None]:
        # Readers keep reading a WAL database meanwhile; only writers wait.
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _execute(self, statement: str) -> None:
        self._connection().execute(statement)

    def _upsert(self, incident: Incident, text: str, coordinator: str, owner: str) -> None:
        with refused_as(sqlite3.Error):
            self._db().execute(
                "INSERT INTO incidents (id, job_id, detected_at, kind, coordinator, owner, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                (incident["id"], incident["job_id"], incident["detected_at"], incident["kind"],
                 coordinator, owner, text))

    def _prune(self, now: float) -> None:
        with refused_as(sqlite3.Error):
            db = self._db()
            db.execute("DELETE FROM incidents WHERE detected_at < ?",
                       (now - self.retention.days * 86400,))
            # Both through the index on detected_at: a store of many incidents prunes in log
            # time.
            beyond = db.execute("SELECT detected_at FROM incidents ORDER BY detected_at DESC "
                                "LIMIT 1 OFFSET ?", (self.retention.count,)).fetchone()
            if beyond is not None:
                db.execute("DELETE FROM incidents WHERE detected_at <= ?", beyond)
            self._evict()

    def _used(self) -> int:
        # The database's pages in use: the whole of what the file holds (the indexes too) is
        # bounded, and the check is three pragmas that read no row.
        return _used_bytes(self._connection())

    def _largest_owner(self) -> str | None:
        row = self._connection().execute(
            f"SELECT owner FROM incidents GROUP BY owner ORDER BY SUM({_BYTES}) DESC, owner "
            "LIMIT 1").fetchone()
        return None if row is None else str(row[0])

    def _drop_oldest(self, owner: str, excess: int) -> int:
        return self._connection().execute(
            f"DELETE FROM incidents WHERE id IN (SELECT id FROM (SELECT id, SUM({_BYTES}) OVER "
            f"(ORDER BY detected_at, id) - {_BYTES} AS before FROM incidents WHERE owner = ? "
            f"AND id <> {_NEWEST}) WHERE before < ?)", (owner, excess)).rowcount

    def used_bytes(self) -> int:
        """The bytes of the database's pages in use."""
        with refused_as(sqlite3.Error):
            return _used_bytes(self._db())

    def listed(self, limit: int = 100) -> list[Stored]:
        with refused_as(sqlite3.Error):
            rows = self._db().execute("SELECT body, coordinator FROM incidents "
                                      "ORDER BY detected_at DESC LIMIT ?", (limit,))
            return [Stored(body, coordinator) for body, coordinator in rows]

    def get_json(self, incident_id: str) -> str | None:
        with refused_as(sqlite3.Error):
            row = self._db().execute("SELECT body FROM incidents WHERE id = ?",
                                     (incident_id,)).fetchone()
        return None if row is None else str(row[0])

    def latest_json(self, job_id: str, kinds: Collection[str]) -> str | None:
        marks = ",".join("?" * len(kinds))
        with refused_as(sqlite3.Error):
            row = self._db().execute(
                f"SELECT body FROM incidents WHERE job_id = ? AND kind IN ({marks}) "
                "ORDER BY detected_at DESC LIMIT 1", (job_id, *kinds)).fetchone()
        return None if row is None else str(row[0])

    def kind_json(self, job_id: str, kind: str) -> list[str]:
        with refused_as(sqlite3.Error):
            rows = self._db().execute(
                "SELECT body FROM incidents WHERE job_id = ? AND kind = ? "
                "ORDER BY detected_at DESC", (job_id, kind))
            return [body for (body,) in rows]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _used_bytes(db: sqlite3.Connection) -> int:
    """The bytes of the database's pages in use (its free pages are reused before it grows)."""
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    (free,) = db.execute("PRAGMA freelist_count").fetchone()
    (size,) = db.execute("PRAGMA page_size").fetchone()
    return int((pages - free) * size)


def _make_private(path: str) -> None:
    """The database's directory made 0700 when we make it, then its files made private
    (`nolinks.make_private`).

    Nothing here opens a file that already exists but O_PATH: closing any other descriptor of
    a file drops every POSIX lock this process holds on it, SQLite's included, and a process
    that holds the database open (a coordinator that also serves readers) would then look, to
    the next process that closes it, as if it were gone: that one deletes the live WAL."""
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    nolinks.warn_shared_directory(path)
    nolinks.make_private(path)
