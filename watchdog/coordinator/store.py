"""The incident store's interface (coordinator process, and the CLI reading it back), and the one
place that picks its backend from what `--db` names (`store_for`): `sqlite_store` (a file, the
default) or `postgres_store` (a server that several coordinators share).

An incident is stored as the exact JSON text that was reported, so what `watchdog incidents`
prints later is byte-identical to what the coordinator emitted (a notice is emitted twice: when
said, and with `ended_at` once its rank moved on; the row holds the latest), beside the name of
the coordinator that stored it first. The coordinator reaches it only from a thread
(`persist`), never from its event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from watchdog.coordinator.database import POSTGRES, Database
from watchdog.coordinator.nolinks import open_own
from watchdog.errors import SchemaTooNewError, StoreError
from watchdog.schema import Incident

log = logging.getLogger(__name__)

KEEP_COUNT = 10_000
KEEP_DAYS = 90.0
# A quarter of the 1 GiB volume the Kubernetes example gives the coordinator: room for the WAL,
# and for the incidents that `KEEP_COUNT` allows, unless they are huge.
KEEP_MIB = 256
# The table that says which of a backend's MIGRATIONS a database has had (the same in both).
SCHEMA_TABLE = "incidents_schema"


def incident_json(incident: Incident) -> str:
    return json.dumps(incident, separators=(", ", ": "))


@dataclass(frozen=True)
class Stored:
    text: str  # the incident's JSON, exactly as it was reported
    coordinator: str  # the coordinator that stored it first ("" before that was recorded)


@dataclass(frozen=True)
class Retention:
    """The newest `count` incidents, none older than `days`, and within `bytes` (the newest
    incident is always kept). Past `bytes`, the owner whose incidents take the most loses its
    oldest first: one user's large incidents never evict another user's history."""

    count: int = KEEP_COUNT
    days: float = KEEP_DAYS
    bytes: int = KEEP_MIB << 20


DEFAULT_RETENTION = Retention()


def store_for(database: Database, retention: Retention = DEFAULT_RETENTION,
              coordinator: str = "") -> IncidentStore:
    """The store of `database`, not opened yet; `coordinator` names the one that stores into
    it (a reader leaves it empty)."""
    if database.kind == POSTGRES:
        from watchdog.coordinator.postgres_store import PostgresStore

        return PostgresStore(database.target, retention, coordinator=coordinator)
    from watchdog.coordinator.sqlite_store import SqliteStore

    return SqliteStore(database.target, retention, coordinator=coordinator)


class IncidentStore(ABC):
    """Incidents by id, within a `Retention`.

    The database is opened on first use (`open` opens it at once), so a coordinator can start,
    and print incidents, while it is locked or unreachable; opening it creates or migrates its
    schema. Its failures are StoreErrors: a call waits at most about `busy_timeout` seconds for
    a busy or silent database. The coordinator calls from a thread of its own, which may differ
    from the one that made the store.

    Incidents the database refused wait, in order, in a file (`spill_path`: JSON lines, 0600)
    that the next process to open the database stores, before anything else it does there.
    """

    busy_timeout: float
    where: str  # the database, fit to print and log: a path, or a URL without its password
    spill_path: str

    def __init__(self, retention: Retention, coordinator: str) -> None:
        self.retention = retention
        self.coordinator = coordinator
        self._spill_taken = False

    def open(self) -> None:
        """Open the database now: StoreError, with a hint, when it cannot be."""
        self._ready()

    def add(self, incident: Incident, owner: str = "") -> None:
        """Persist one incident: one row per id. Adding an id again stores its newer text in
        place (a notice that ended gains `ended_at`); the same text again changes nothing.
        `owner`: the user whose ranks it names (a uid; "" unknown), whose share of
        `Retention.bytes` it counts in."""
        self._add(incident, self.coordinator, owner)

    def _add(self, incident: Incident, coordinator: str, owner: str) -> None:
        self._ready()
        self._upsert(incident, incident_json(incident), coordinator, owner)
        self._prune(now=float(incident["detected_at"]))

    def _evict(self) -> None:
        """While the store holds more than `Retention.bytes`, drop the oldest incidents of the
        owner whose incidents take the most bytes (the newest incident counted, never dropped):
        no owner's incident is dropped to make room for another's while that other holds more."""
        while (excess := self._used() - self.retention.bytes) > 0:
            owner = self._largest_owner()
            if owner is None or not self._drop_oldest(owner, excess):
                return

    def _ready(self) -> None:
        """Connected, with incidents spilled by an earlier process (or a running coordinator
        whose database fails) stored once, before anything else is done with it. While they
        cannot be, they are tried again on each use, and reading goes on."""
        self._connect()
        if not self._spill_taken:
            self._spill_taken = True  # set first: storing them comes back here
            try:
                self._take_spilled()
            except (OSError, StoreError) as e:
                self._spill_taken = False
                log.warning("cannot store the incidents kept in %s yet: %s", self.spill_path,
                            str(e).splitlines()[0])

    def spill(self, incidents: list[Incident], owners: Mapping[str, str] | None = None) -> None:
        """Keep incidents the database refused in the spill file (made 0600, in a directory
        made 0700): the next process that opens the database stores them, as stored by this
        store's coordinator, each with its owner (`owners`, by incident id)."""
        os.makedirs(os.path.dirname(self.spill_path) or ".", mode=0o700, exist_ok=True)
        while True:
            fd = open_own(self.spill_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_nlink == 0:
                    continue  # taken and removed while we waited: a new file, then
                f.writelines(json.dumps({"coordinator": self.coordinator, "incident": incident,
                                         "owner": (owners or {}).get(incident["id"], "")},
                                        separators=(",", ":")) + "\n" for incident in incidents)
                f.flush()
                os.fsync(fd)
                return

    def take_spilled(self) -> None:
        """Store the incidents an earlier process, or this one, kept aside, and remove them."""
        self._ready()
        self._take_spilled()

    def _take_spilled(self) -> None:
        try:
            with os.fdopen(open_own(self.spill_path, os.O_RDONLY), encoding="utf-8") as f:
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
                kept = json.loads(line)
            except ValueError:
                continue  # a line cut short when the disk filled up
            if "incident" in kept:
                self._add(kept["incident"], kept["coordinator"], str(kept.get("owner", "")))
            else:  # a bare incident, as earlier releases kept them
                self._add(kept, "", "")

    def _migrate(self, migrations: Sequence[Sequence[str]]) -> None:
        """Bring the database to the newest of `migrations` (step N takes it from version N to
        N + 1; none recorded is version 0), under the backend's lock so that one process
        migrates and the others find it done. SchemaTooNewError for a newer version: a
        release that does not know a table's columns must not write it."""
        newest = len(migrations)
        found = self._schema_version()
        if found < newest:
            with self._schema_lock():
                found = self._schema_version()
                for step in migrations[found:]:
                    for statement in step:
                        self._execute(statement)
                if found < newest:
                    self._execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} "
                                  "(version INTEGER NOT NULL)")
                    self._execute(f"DELETE FROM {SCHEMA_TABLE}")
                    self._execute(f"INSERT INTO {SCHEMA_TABLE} (version) VALUES ({newest})")
                    log.info("the incident database %s: schema version %d -> %d", self.where,
                             found, newest)
                    found = newest
        if found > newest:
            raise SchemaTooNewError(f"the incident database {self.where} has schema version "
                                    f"{found}; this torch-hang-watchdog knows up to {newest}")

    # -- what each backend does; its database's failures raise StoreError --

    @abstractmethod
    def _connect(self) -> None:
        """Connect, unless connected, and migrate the schema (`_migrate`)."""

    @abstractmethod
    def _schema_version(self) -> int:
        """The version SCHEMA_TABLE records; 0 where it records none."""

    @abstractmethod
    def _schema_lock(self) -> contextlib.AbstractContextManager[None]:
        """A transaction that no other process migrating the database runs beside."""

    @abstractmethod
    def _execute(self, statement: str) -> None: ...

    @abstractmethod
    def _upsert(self, incident: Incident, text: str, coordinator: str, owner: str) -> None:
        """Insert the row of `incident` (`text`), or replace its text; the coordinator that
        stored it first, and its owner, stay."""

    @abstractmethod
    def _used(self) -> int:
        """What `Retention.bytes` bounds, in a transaction `_prune` holds."""

    @abstractmethod
    def _largest_owner(self) -> str | None:
        """The owner whose incidents take the most bytes; None when the store is empty."""

    @abstractmethod
    def _drop_oldest(self, owner: str, excess: int) -> int:
        """Drop the oldest incidents of `owner` whose texts hold `excess` bytes (one at least,
        never the newest of the store); how many were dropped."""

    @abstractmethod
    def _prune(self, now: float) -> None:
        """Drop incidents beyond the retention limits (older ones first)."""

    @abstractmethod
    def used_bytes(self) -> int:
        """What `Retention.bytes` bounds."""

    @abstractmethod
    def listed(self, limit: int = 100) -> list[Stored]:
        """Stored incidents, newest first."""

    @abstractmethod
    def get_json(self, incident_id: str) -> str | None: ...

    @abstractmethod
    def latest_json(self, job_id: str, kinds: Collection[str]) -> str | None:
        """The newest incident of one job among those of `kinds`."""

    @abstractmethod
    def kind_json(self, job_id: str, kind: str) -> list[str]:
        """Every incident of one kind in one job, newest first."""

    @abstractmethod
    def close(self) -> None: ...


def first_line(error: BaseException) -> str:
    return str(error).strip().split("\n")[0]


@contextlib.contextmanager
def refused_as(*failures: type[BaseException]) -> Iterator[None]:
    """A backend's own errors (`failures`) raised as the StoreError that callers expect."""
    try:
        yield
    except failures as e:
        raise StoreError(first_line(e)) from e
