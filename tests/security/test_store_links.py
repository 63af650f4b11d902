"""Issue 37, findings 3 and 4: the store followed links another user planted. Root's
`watchdog incidents --db PATH`, on a path in `nobody`'s directory, chmodded a root-owned 0644
file to 0600 through a link at the database or its `-wal`, and created a root-owned database
through a dangling one; a coordinator whose database failed appended the incident to a
root-only file linked at `<db>.pending`. Now a link there is refused, and root is warned of a
database in a directory another user can write."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.helpers.attack import (
    AS_NOBODY,
    NOBODY,
    WATCHDOG,
    agent,
    clean_env,
    coordinator,
    hung_job,
    scratch_dir,
    verdict,
    worker,
)
from tests.helpers.everyone import python

LOCKER = ("import sqlite3, sys, time\n"
          "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
          "db.execute('BEGIN EXCLUSIVE')\n"
          "print('locked', flush=True); time.sleep(300)\n")


@contextmanager
def _locked(db: Path) -> Iterator[None]:
    """nobody's database at `db` (root's coordinator made it WAL), held locked: every write
    of root's fails."""
    proc = subprocess.Popen([*AS_NOBODY, python(), "-c", LOCKER, str(db)],
                            stdout=subprocess.PIPE, text=True, cwd="/", env=clean_env())
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        yield
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def places() -> Iterator[tuple[Path, Path]]:
    """nobody's directory (0755, theirs), and root's (0700) with root's files in it."""
    with scratch_dir() as scratch:
        home, roots = scratch / "nobody-home", scratch / "roots"
        home.mkdir(0o755)
        os.chown(home, NOBODY, -1)
        roots.mkdir(0o700)
        yield home, roots


def plant(link: Path, target: Path) -> None:
    subprocess.run([*AS_NOBODY, "ln", "-s", str(target), str(link)], check=True)


def root_file(path: Path, mode: int, text: str = "root's\n") -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_incidents_as_root_follows_no_link_at_the_database(places: tuple[Path, Path]) -> None:
    home, roots = places
    shared = root_file(roots / "shared.conf", 0o644)
    plant(home / "a.db", shared)
    plant(home / "b.db", roots / "created.db")  # dangling
    subprocess.run([*AS_NOBODY, "sh", "-c", f": > {home / 'c.db'}"], check=True)
    wal = root_file(roots / "wal.conf", 0o644)
    plant(home / "c.db-wal", wal)
    for db in ("a.db", "b.db", "c.db"):
        listed = subprocess.run([*WATCHDOG, "incidents", "list", "--db", str(home / db)],
                                capture_output=True, text=True, timeout=60, env=clean_env())
        assert listed.returncode != 0 and "is a symbolic link" in listed.stderr, listed.stderr
        assert "another user can write" in listed.stderr, listed.stderr
    assert shared.stat().st_mode & 0o777 == 0o644 and wal.stat().st_mode & 0o777 == 0o644
    assert not (roots / "created.db").exists()


def test_a_coordinator_appends_nothing_through_a_link_at_its_spill_file(
        places: tuple[Path, Path]) -> None:
    home, roots = places
    secret = root_file(roots / "secret", 0o600)
    subprocess.run([*AS_NOBODY, "sh", "-c", f": > {home / 'spill.db'}"], check=True)
    with scratch_dir() as scratch, ExitStack() as stack:
        coord = stack.enter_context(coordinator(scratch, "--db", str(home / "spill.db")))
        plant(home / "spill.db.pending", secret)  # once the coordinator took what was there
        stack.enter_context(_locked(home / "spill.db"))  # the coordinator cannot store
        stack.enter_context(agent(scratch, scratch / "beacons", "--coordinator", coord.address))
        for spec in hung_job(scratch / "beacons", "spilled-job"):
            stack.enter_context(worker(spec))
        verdict(coord.address, "spilled-job", timeout=90)
        coord.stop()  # closing spills what is pending once more
        log = coord.output()
    assert "cannot keep incidents aside" in log or "could not be stored" in log, log
    assert secret.read_text() == "root's\n", log
