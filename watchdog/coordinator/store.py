"""Incident history in SQLite (coordinator process, and the CLI reading it back).

An incident is stored as the exact JSON text that was reported, so what `watchdog incidents`
prints later is byte-identical to what the coordinator emitted.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Collection
from pathlib import Path
from typing import Any

from watchdog.errors import WatchdogError

DB_ENV = "WATCHDOG_DB"
KEEP_COUNT = 10_000
KEEP_DAYS = 90.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    detected_at REAL NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_detected ON incidents (detected_at);
CREATE INDEX IF NOT EXISTS incidents_job ON incidents (job_id, detected_at);
"""


def default_db_path() -> str:
    """$WATCHDOG_DB, else a system path for root and a per-user state path otherwise."""
    explicit = os.environ.get(DB_ENV)
    if explicit:
        return explicit
    if os.geteuid() == 0:
        return "/var/lib/torch-hang-watchdog/incidents.db"
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "torch-hang-watchdog", "incidents.db")


def incident_json(incident: dict[str, Any]) -> str:
    return json.dumps(incident, separators=(", ", ": "))


class IncidentStore:
    """Incidents by id; retention keeps the newest `keep_count`, none older than `keep_days`."""

    def __init__(self, path: str, keep_count: int = KEEP_COUNT,
                 keep_days: float = KEEP_DAYS) -> None:
        self.path = path
        self.keep_count = keep_count
        self.keep_days = keep_days
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise WatchdogError(f"cannot open the incident database {path}: {e}",
                                hint="pass --db PATH to a writable location") from e

    def add(self, incident: dict[str, Any]) -> None:
        """Persist one incident; a second add of the same id is ignored (at most once)."""
        self._db.execute(
            "INSERT OR IGNORE INTO incidents (id, job_id, detected_at, kind, body) "
            "VALUES (?, ?, ?, ?, ?)",
            (incident["id"], incident["job_id"], incident["detected_at"], incident["kind"],
             incident_json(incident)))
        self.prune(now=float(incident["detected_at"]))

    def prune(self, now: float) -> None:
        """Drop incidents beyond the retention limits (older ones first)."""
        self._db.execute("DELETE FROM incidents WHERE detected_at < ?",
                         (now - self.keep_days * 86400,))
        self._db.execute(
            "DELETE FROM incidents WHERE id NOT IN "
            "(SELECT id FROM incidents ORDER BY detected_at DESC LIMIT ?)", (self.keep_count,))

    def list_json(self, limit: int = 100) -> list[str]:
        """Stored incident texts, newest first."""
        rows = self._db.execute(
            "SELECT body FROM incidents ORDER BY detected_at DESC LIMIT ?", (limit,))
        return [body for (body,) in rows]

    def latest_json(self, job_id: str, kinds: Collection[str]) -> str | None:
        """The newest incident of one job among those of `kinds`."""
        marks = ",".join("?" * len(kinds))
        row = self._db.execute(
            f"SELECT body FROM incidents WHERE job_id = ? AND kind IN ({marks}) "
            "ORDER BY detected_at DESC LIMIT 1", (job_id, *kinds)).fetchone()
        return None if row is None else str(row[0])

    def kind_json(self, job_id: str, kind: str) -> list[str]:
        """Every incident of one kind in one job, newest first."""
        rows = self._db.execute(
            "SELECT body FROM incidents WHERE job_id = ? AND kind = ? ORDER BY detected_at DESC",
            (job_id, kind))
        return [body for (body,) in rows]

    def get_json(self, incident_id: str) -> str | None:
        row = self._db.execute("SELECT body FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        self._db.close()
