"""Incident history in SQLite (coordinator process, and the CLI reading it back).

An incident is stored as the exact JSON text that was reported, so what `watchdog incidents`
prints later is byte-identical to what the coordinator emitted (a notice is emitted twice: when
said, and with `ended_at` once its rank moved on; the row holds the latest). The coordinator
reaches it only from a thread (`persist`), never from its event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import sqlite3
import stat
import time
from collections.abc import Collection
from pathlib import Path

from watchdog.errors import WatchdogError
from watchdog.schema import Incident

log = logging.getLogger(__name__)

DB_ENV = "WATCHDOG_DB"
KEEP_COUNT = 10_000
KEEP_DAYS = 90.0
# A quarter of the 1 GiB volume the Kubernetes example gives the coordinator: room for the WAL,
# and for the incidents that `KEEP_COUNT` allows, unless they are huge.
KEEP_MIB = 256

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


def incident_json(incident: Incident) -> str:
    return json.dumps(incident, separators=(", ", ": "))


class IncidentStore:
    """Incidents by id; retention keeps the newest `keep_count`, none older than `keep_days`,
    and the database's pages in use within `keep_bytes` (the newest incident is always kept).

    The database is opened on first use (`open` opens it at once), so a coordinator can start,
    and print incidents, while it is locked or unreachable. The file, its WAL and shared-memory
    files are the owner's alone (0600): incidents hold every rank's stacks and log lines. A
    locked database fails after `busy_timeout` seconds; the coordinator calls from a thread of
    its own, which may differ from the one that made the store.
    """

    def __init__(self, path: str, keep_count: int = KEEP_COUNT,
                 keep_days: float = KEEP_DAYS, busy_timeout: float = 1.0,
                 keep_bytes: int = KEEP_MIB << 20) -> None:
        self.path = path
        self.keep_count = keep_count
        self.keep_days = keep_days
        self.keep_bytes = keep_bytes
        self.busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._spill_taken = False

    def open(self) -> None:
        """Open the database now: WatchdogError, with a hint, when it cannot be."""
        self._db()

    def _db(self) -> sqlite3.Connection:
        """The connection, opened on first use; incidents spilled by an earlier process (or a
        running coordinator whose database fails) are stored once, before anything else is done
        with it. While they cannot be, they are tried again on each use, and reading goes on."""
        conn = self._connect()
        if not self._spill_taken:
            self._spill_taken = True  # set first: storing them comes back here
            try:
                self._take_spilled()
            except (OSError, sqlite3.Error) as e:
                self._spill_taken = False
                log.warning("cannot store the incidents kept in %s yet: %s", self.spill_path, e)
        return conn

    def _connect(self) -> sqlite3.Connection:
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
            raise WatchdogError(f"cannot open the incident database {self.path}: {e}",
                                hint="pass --db PATH to a writable location") from e
        self._conn = conn
        return conn

    def _open_connection(self) -> sqlite3.Connection:
        _make_private(self.path)
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
        except sqlite3.Error:
            conn.close()
            raise
        return conn

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

    @property
    def spill_path(self) -> str:
        return f"{self.path}.pending"

    def spill(self, incidents: list[Incident]) -> None:
        """Keep incidents the database refused in a file beside it (JSON lines, 0600): the next
        process that opens the database stores them."""
        while True:
            fd = os.open(self.spill_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                         0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_nlink == 0:
                    continue  # taken and removed while we waited: a new file, then
                f.writelines(incident_json(incident) + "\n" for incident in incidents)
                f.flush()
                os.fsync(fd)
                return

    def take_spilled(self) -> None:
        """Store the incidents an earlier process, or this one, kept aside, and remove them."""
        self._db()
        self._take_spilled()

    def _take_spilled(self) -> None:
        try:
            with open(self.spill_path, encoding="utf-8") as f:
                # flock, not fcntl's locks: closing this file must not touch SQLite's locks.
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                if os.fstat(f.fileno()).st_nlink == 0:
                    return  # another process took them
                self._add_lines(f.read().splitlines())
                os.unlink(self.spill_path)
        except FileNotFoundError:
            return

    def _add_lines(self, lines: list[str]) -> None:
        for line in lines:
            try:
                incident: Incident = json.loads(line)
            except ValueError:
                continue  # a line cut short when the disk filled up
            self.add(incident)

    def add(self, incident: Incident) -> None:
        """Persist one incident: one row per id. Adding an id again stores its newer text in
        place (a notice that ended gains `ended_at`); the same text again changes nothing."""
        self._db().execute(
            "INSERT INTO incidents (id, job_id, detected_at, kind, body) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET body = excluded.body",
            (incident["id"], incident["job_id"], incident["detected_at"], incident["kind"],
             incident_json(incident)))
        self.prune(now=float(incident["detected_at"]))

    def prune(self, now: float) -> None:
        """Drop incidents beyond the retention limits (older ones first)."""
        db = self._db()
        db.execute("DELETE FROM incidents WHERE detected_at < ?", (now - self.keep_days * 86400,))
        # Both through the index on detected_at: a store of many incidents prunes in log time.
        beyond = db.execute("SELECT detected_at FROM incidents ORDER BY detected_at DESC "
                            "LIMIT 1 OFFSET ?", (self.keep_count,)).fetchone()
        if beyond is not None:
            db.execute("DELETE FROM incidents WHERE detected_at <= ?", beyond)
        self._prune_bytes(db)

    def _prune_bytes(self, db: sqlite3.Connection) -> None:
        """Drop the oldest incidents while the database's pages in use hold more than
        `keep_bytes`; never the newest. Counted in pages, the whole of what the file holds (the
        indexes too) is bounded, and the check is three pragmas that read no row."""
        while (used := _used_bytes(db)) > self.keep_bytes:
            (count,) = db.execute("SELECT COUNT(*) FROM incidents").fetchone()
            if count <= 1:
                return
            # At the average size, the oldest rows that hold the excess: one statement, rather
            # than one a row, when one huge incident arrives in a store of small ones.
            doomed = min(count - 1, math.ceil(count * (used - self.keep_bytes) / used))
            db.execute("DELETE FROM incidents WHERE id IN (SELECT id FROM incidents "
                       "ORDER BY detected_at LIMIT ?)", (doomed,))

    def used_bytes(self) -> int:
        """The bytes of the database's pages in use, which `keep_bytes` bounds."""
        return _used_bytes(self._db())

    def list_json(self, limit: int = 100) -> list[str]:
        """Stored incident texts, newest first."""
        rows = self._db().execute(
            "SELECT body FROM incidents ORDER BY detected_at DESC LIMIT ?", (limit,))
        return [body for (body,) in rows]

    def latest_json(self, job_id: str, kinds: Collection[str]) -> str | None:
        """The newest incident of one job among those of `kinds`."""
        marks = ",".join("?" * len(kinds))
        row = self._db().execute(
            f"SELECT body FROM incidents WHERE job_id = ? AND kind IN ({marks}) "
            "ORDER BY detected_at DESC LIMIT 1", (job_id, *kinds)).fetchone()
        return None if row is None else str(row[0])

    def kind_json(self, job_id: str, kind: str) -> list[str]:
        """Every incident of one kind in one job, newest first."""
        rows = self._db().execute(
            "SELECT body FROM incidents WHERE job_id = ? AND kind = ? ORDER BY detected_at DESC",
            (job_id, kind))
        return [body for (body,) in rows]

    def get_json(self, incident_id: str) -> str | None:
        row = self._db().execute("SELECT body FROM incidents WHERE id = ?",
                                 (incident_id,)).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# SQLite's "file is not a database" and "database disk image is malformed".
_DAMAGED = (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)


def _used_bytes(db: sqlite3.Connection) -> int:
    """The bytes of the database's pages in use (its free pages are reused before it grows)."""
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    (free,) = db.execute("PRAGMA freelist_count").fetchone()
    (size,) = db.execute("PRAGMA page_size").fetchone()
    return int((pages - free) * size)


def _make_private(path: str) -> None:
    """The database's directory made 0700 when we make it, the database file created 0600, and
    the files of it that we own and others could read set to 0600; SQLite gives the WAL and
    shared-memory files it creates later the database file's mode.

    Nothing here opens a file that already exists: closing any descriptor of a file drops every
    POSIX lock this process holds on it, SQLite's included, and a process that holds the
    database open (a coordinator that also serves readers) would then look, to the next
    process that closes it, as if it were gone: that one deletes the live WAL."""
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    for name in (path, f"{path}-wal", f"{path}-shm"):
        try:
            st = os.stat(name)
        except FileNotFoundError:
            continue
        # Files only: a directory given as the database (even "/") is refused by SQLite, and
        # must not lose its mode first.
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(name, 0o600)
