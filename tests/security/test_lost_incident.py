"""Attack 9, a locked database: someone holds the incident database's write lock while a job
hangs. The incident is printed, `--on-hang kill` ends the job, and the incident is stored once
the database can be written again; nothing waits on the lock in the event loop."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.helpers.attack import WATCHDOG, clean_env, scratch_dir
from tests.helpers.daemons import HANG_AFTER_3_STEPS
from watchdog.cli.demo import free_port
from watchdog.coordinator.sqlite_store import SqliteStore


def test_a_locked_database_loses_no_incident_and_stops_no_kill(tmp_path: Path) -> None:
    with scratch_dir() as scratch:
        db = scratch / "incidents.db"
        report = scratch / "incident.json"
        SqliteStore(str(db)).open()  # exists, in WAL mode, as it would after earlier runs
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # writers wait; this one never lets go during the run
        try:
            run = subprocess.run(
                [*WATCHDOG, "run", "--stall-timeout", "2", "--on-hang", "kill", "--db", str(db),
                 "--report", str(report), "--", sys.executable, "-c", HANG_AFTER_3_STEPS],
                capture_output=True, text=True, timeout=180, cwd="/",
                env=clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(free_port())))
        finally:
            lock.rollback()
            lock.close()
        incident = json.loads(report.read_text())
        stored = subprocess.run([*WATCHDOG, "incidents", "list", "--json", "--db", str(db)],
                                capture_output=True, text=True, timeout=60, check=True)
        mode = db.stat().st_mode & 0o777
    assert run.returncode == 3, run.stderr
    assert f"RANK_STALLED in job {incident['job_id']}" in run.stderr
    assert "watchdog: ending the hung job (--on-hang kill)" in run.stderr
    assert "cannot store incidents in" in run.stderr
    assert "stored the next time it opens" in run.stderr
    assert [i["id"] for i in json.loads(stored.stdout)] == [incident["id"]]
    assert mode == 0o600
