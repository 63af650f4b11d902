"""Incidents on a PostgreSQL server (`IncidentStore`'s backend for a `postgresql://` URL, the
`postgres` extra, psycopg 3): one history that several coordinators share, the shards of a
fleet or an active and a standby. Incidents the server refused wait in the coordinator's state
directory, in a file named after the database (never its password)."""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Collection, Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from watchdog.coordinator.database import mask, state_dir
from watchdog.coordinator.store import (
    DEFAULT_RETENTION,
    SCHEMA_TABLE,
    IncidentStore,
    Retention,
    Stored,
    first_line,
    refused_as,
)
from watchdog.errors import StoreError, StoreUnavailableError
from watchdog.schema import Incident

# Advisory locks, held for a transaction: one process migrates the schema at a time, and one
# prunes (they are the database's, whichever table, so these keys are the watchdog's own).
SCHEMA_LOCK = 0x7468_7700_0001
PRUNE_LOCK = 0x7468_7700_0002
# How long a statement may run (ms): pruning the whole retention at once fits well within it.
STATEMENT_TIMEOUT_MS = 10_000
# Step N takes the schema from version N to N + 1 (`IncidentStore._migrate`).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the incidents, with the coordinator that stored each and the bytes of its text.
    ("CREATE TABLE IF NOT EXISTS incidents (id TEXT PRIMARY KEY, job_id TEXT NOT NULL, "
     "detected_at DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL, coordinator TEXT NOT NULL, "
     "bytes INTEGER NOT NULL, body TEXT NOT NULL)",
     "CREATE INDEX IF NOT EXISTS incidents_detected ON incidents (detected_at)",
     "CREATE INDEX IF NOT EXISTS incidents_job ON incidents (job_id, detected_at)"),
    # 2: the user whose ranks each incident names: the unit of the byte budget's eviction.
    ("ALTER TABLE incidents ADD COLUMN IF NOT EXISTS owner TEXT NOT NULL DEFAULT ''",
     "CREATE INDEX IF NOT EXISTS incidents_owner ON incidents (owner, detected_at)"),
)


class PostgresStore(IncidentStore):
    """`busy_timeout` bounds a connection attempt (libpq counts whole seconds, 2 at least) and
    the wait for a lock; `Retention.bytes` bounds the bytes of the incidents' texts (what the
    server's files take besides is its own: TOAST compresses the texts, VACUUM reclaims what
    pruning deleted). Coordinators sharing the database prune one at a time: one that finds
    another pruning leaves it to that one, and prunes with its next incident."""

    def __init__(self, url: str, retention: Retention = DEFAULT_RETENTION,
                 busy_timeout: float = 2.0, coordinator: str = "") -> None:
        super().__init__(retention, coordinator)
        self._url = url
        self.where = mask(url)
        self.spill_path = os.path.join(state_dir(), f"{spill_name(url)}.pending")
        self.busy_timeout = busy_timeout
        self._conn: psycopg.Connection[TupleRow] | None = None

    def _db(self) -> psycopg.Connection[TupleRow]:
        self._ready()
        return self._connection()

    def _connect(self) -> None:
        self._connection()

    def _connection(self) -> psycopg.Connection[TupleRow]:
        """The connection, made again once it broke (the server restarted, the network
        failed): each call that finds it so reconnects, so the server's return is seen."""
        if self._conn is not None and not (self._conn.broken or self._conn.closed):
            return self._conn
        self.close()
        try:
            self._conn = psycopg.connect(self._url, autocommit=True, **self._settings())
        except psycopg.Error as e:
            raise StoreUnavailableError(f"cannot reach the incident database {self.where}: "
                                        f"{first_line(e)}") from e
        try:
            self._conn.execute("SELECT set_config('lock_timeout', %s, false), "
                               "set_config('statement_timeout', %s, false)",
                               (str(int(self.busy_timeout * 1000)), str(STATEMENT_TIMEOUT_MS)))
            self._migrate(MIGRATIONS)
        except psycopg.Error as e:
            self.close()
            raise StoreError(f"cannot set up the incident database {self.where}: "
                             f"{first_line(e)}") from e
        except StoreError:
            self.close()
            raise
        return self._conn

    def _settings(self) -> dict[str, Any]:
        """What the URL leaves unsaid: a connection attempt that gives up within the busy
        timeout, a name in pg_stat_activity, and a server gone silent mid-call given up on in
        seconds (TCP keepalives, and the kernel's own retries bounded), not a quarter of an
        hour, while the thread that stores incidents waits."""
        silent_s = max(5, math.ceil(self.busy_timeout))
        defaults: dict[str, Any] = {
            "connect_timeout": max(2, math.ceil(self.busy_timeout)),
            "application_name": "torch-hang-watchdog", "keepalives": 1,
            "keepalives_idle": silent_s, "keepalives_interval": 1, "keepalives_count": 3}
        if psycopg.pq.version() >= 120000:  # libpq 12 knows tcp_user_timeout
            defaults["tcp_user_timeout"] = silent_s * 1000
        given = conninfo_to_dict(self._url)
        return {key: value for key, value in defaults.items() if key not in given}

    def _schema_version(self) -> int:
        conn = self._connection()
        # pg_tables, read under the statement's snapshot: to_regclass answers from the
        # session's catalog cache, which may still miss a table another coordinator's
        # migration committed while this one waited for the schema lock.
        exists = conn.execute("SELECT 1 FROM pg_catalog.pg_tables WHERE tablename = %s "
                              "AND schemaname = current_schema()", (SCHEMA_TABLE,)).fetchone()
        if exists is None:
            return 0
        row = conn.execute(f"SELECT max(version) FROM {SCHEMA_TABLE}").fetchone()
        return int(row[0] or 0) if row else 0

    @contextlib.contextmanager
    def _schema_lock(self) -> Iterator[None]:
        conn = self._connection()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            yield

    def _execute(self, statement: str) -> None:
        self._connection().execute(statement)

    def _upsert(self, incident: Incident, text: str, coordinator: str, owner: str) -> None:
        with refused_as(psycopg.Error):
            self._db().execute(
                "INSERT INTO incidents (id, job_id, detected_at, kind, coordinator, owner, bytes, "
                "body) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                "body = excluded.body, bytes = excluded.bytes "
                "WHERE incidents.body <> excluded.body",
                (incident["id"], incident["job_id"], incident["detected_at"], incident["kind"],
                 coordinator, owner, len(text.encode()), text))

    def _prune(self, now: float) -> None:
        with refused_as(psycopg.Error):
            conn = self._db()
            with conn.transaction():
                (mine,) = conn.execute("SELECT pg_try_advisory_xact_lock(%s)",
                                       (PRUNE_LOCK,)).fetchone() or (False,)
                if not mine:
                    return
                conn.execute("DELETE FROM incidents WHERE detected_at < %s",
                             (now - self.retention.days * 86400,))
                conn.execute("DELETE FROM incidents WHERE detected_at <= (SELECT detected_at "
                             "FROM incidents ORDER BY detected_at DESC LIMIT 1 OFFSET %s)",
                             (self.retention.count,))
                self._evict()

    def _used(self) -> int:
        return self._used_bytes(self._db())

    def _largest_owner(self) -> str | None:
        row = self._db().execute("SELECT owner FROM incidents GROUP BY owner "
                                 "ORDER BY sum(bytes) DESC, owner LIMIT 1").fetchone()
        return None if row is None else str(row[0])

    def _drop_oldest(self, owner: str, excess: int) -> int:
        return self._db().execute(
            "DELETE FROM incidents WHERE id IN (SELECT id FROM (SELECT id, sum(bytes) OVER "
            "(ORDER BY detected_at, id) - bytes AS before FROM incidents WHERE owner = %s "
            "AND id <> (SELECT id FROM incidents ORDER BY detected_at DESC, id DESC LIMIT 1)) "
            "AS oldest WHERE before < %s)", (owner, excess)).rowcount

    def used_bytes(self) -> int:
        """The bytes of the stored incidents' texts."""
        with refused_as(psycopg.Error):
            return self._used_bytes(self._db())

    @staticmethod
    def _used_bytes(conn: psycopg.Connection[TupleRow]) -> int:
        row = conn.execute("SELECT coalesce(sum(bytes), 0) FROM incidents").fetchone()
        return int(row[0]) if row else 0

    def listed(self, limit: int = 100) -> list[Stored]:
        with refused_as(psycopg.Error):
            rows = self._db().execute("SELECT body, coordinator FROM incidents "
                                      "ORDER BY detected_at DESC LIMIT %s", (limit,))
            return [Stored(body, coordinator) for body, coordinator in rows]

    def get_json(self, incident_id: str) -> str | None:
        with refused_as(psycopg.Error):
            row = self._db().execute("SELECT body FROM incidents WHERE id = %s",
                                     (incident_id,)).fetchone()
        return None if row is None else str(row[0])

    def latest_json(self, job_id: str, kinds: Collection[str]) -> str | None:
        with refused_as(psycopg.Error):
            row = self._db().execute(
                "SELECT body FROM incidents WHERE job_id = %s AND kind = ANY(%s) "
                "ORDER BY detected_at DESC LIMIT 1", (job_id, list(kinds))).fetchone()
        return None if row is None else str(row[0])

    def kind_json(self, job_id: str, kind: str) -> list[str]:
        with refused_as(psycopg.Error):
            rows = self._db().execute(
                "SELECT body FROM incidents WHERE job_id = %s AND kind = %s "
                "ORDER BY detected_at DESC", (job_id, kind))
            return [body for (body,) in rows]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def spill_name(url: str) -> str:
    """The database a URL names as a file name, `pg-USER@HOST-PORT-DBNAME`: never its
    password, which the state directory's listing would show."""
    params = conninfo_to_dict(url)
    named = "{}@{}-{}-{}".format(*(params.get(key, "") for key in ("user", "host", "port",
                                                                      "dbname")))
    return "pg-" + re.sub(r"[^A-Za-z0-9@._-]", "_", named)[:200]
