"""The incident store under faults, with real daemons, jobs and readers: readers of every kind
beside a live coordinator, a second coordinator on the same database, a coordinator SIGKILLed
while its database refuses an incident, a full filesystem under the database, and a damaged
database file. (The agent and the coordinator killed and restarted mid-job: test_nodes.py and
test_daemons.py.)"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.attack import wait_for
from tests.helpers.daemons import (
    HANG_AFTER_3_STEPS,
    WebDaemons,
    end_job,
    running,
    start_job,
    status,
    wait_for_verdict,
)
from tests.helpers.harness import WATCHDOG, job_env, stop_process, stored, wait_for_output
from watchdog.cli.demo import free_port, torchrun_command

SPILL_DEADLINE_S = 30
READER_PAUSE_S = 1.0


class Readers:
    """`incidents list`, `status` and the web view, each in turn, until stopped; a failed
    `incidents list` or page of the web view is kept to be asserted on."""

    def __init__(self, daemons: WebDaemons) -> None:
        self.daemons = daemons
        self.rounds = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            listed = subprocess.run([*WATCHDOG, "incidents", "list", "--json"],
                                    env=self.daemons.env, capture_output=True, text=True,
                                    timeout=60)
            if listed.returncode != 0:
                self.failures.append(listed.stderr)
            status(self.daemons.address)
            try:
                with urllib.request.urlopen(f"http://{self.daemons.web}/", timeout=20) as page:
                    page.read()
            except urllib.error.HTTPError as e:
                self.failures.append(f"web view: {e}")
            except urllib.error.URLError:
                pass  # not listening yet
            self.rounds += 1
            self._stop.wait(READER_PAUSE_S)  # readers, not a CPU hog slowing the jobs down

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[WebDaemons]:
    with running(WebDaemons, tmp_path) as d:
        yield d


def printed_ids(logs: list[str]) -> set[str]:
    return set(re.findall(r" incident (\S+): ", "\n".join(logs)))


def test_every_printed_incident_survives_readers_a_second_coordinator_and_sigkill(
        daemons: WebDaemons, tmp_path: Path) -> None:
    db = Path(daemons.env["WATCHDOG_DB"])
    spill = Path(f"{db}.pending")
    readers = Readers(daemons)
    second = daemons._spawn("coordinator", "--listen", f"127.0.0.1:{free_port()}")
    holder = sqlite3.connect(db, isolation_level=None)
    jobs = [start_job(tmp_path, *WATCHDOG, "launch", "--", job_id="store-a", nproc=3)]
    try:
        first = wait_for_verdict(daemons.address, "store-a")["verdict"]
        second_log = stop_process(second)  # a second coordinator on the database, gone again
        seen = [i for i in stored(tmp_path) if i["id"] == first["id"]]  # a reader, live
        assert seen == [first], f"stored, yet no reader finds it: {sorted(db.parent.iterdir())}"
        holder.execute("BEGIN EXCLUSIVE")  # from now on the database refuses writers
        jobs.append(start_job(tmp_path, *WATCHDOG, "launch", "--", job_id="store-b", nproc=3))
        refused = wait_for_verdict(daemons.address, "store-b")["verdict"]
        wait_for(lambda: spill.exists() or refused in stored(tmp_path),
                 f"incident {refused['id']} kept aside in {spill} or found by a reader",
                 SPILL_DEADLINE_S)
        readers.stop()
        for job in jobs:
            end_job(job)
        daemons.kill_coordinator()  # SIGKILL: no chance to store or spill anything more
    finally:
        readers.stop()
        holder.close()
    daemons.coordinator = daemons.start_coordinator()  # stores what was kept aside
    wait_for(lambda: status(daemons.address), "the restarted coordinator")
    kept = {incident["id"]: incident for incident in stored(tmp_path)}
    assert second.returncode == 0, second_log
    assert readers.rounds >= 3 and readers.failures == []
    assert {first["id"], refused["id"]} <= printed_ids(daemons.logs)
    assert printed_ids(daemons.logs) <= set(kept), daemons.logs
    assert kept[first["id"]] == first and kept[refused["id"]] == refused
    assert not spill.exists()




@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of this test's own (the tests run as root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_filesystem_under_the_database_delays_the_incident_and_loses_none(
        small_fs: Path, tmp_path: Path) -> None:
    db = small_fs / "incidents.db"
    filler = small_fs / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
    report = tmp_path / "incident.json"
    script = tmp_path / "job.py"
    script.write_text(HANG_AFTER_3_STEPS)
    run = subprocess.Popen(
        [*WATCHDOG, "run", "--stall-timeout", "2", "--on-hang", "kill", "--db", str(db),
         "--report", str(report), "--", *torchrun_command(2, script=str(script))],
        env=job_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    output: list[str] = []
    try:
        assert run.stderr is not None
        for line in run.stderr:
            output.append(line)
            if "cannot store incidents in" in line:
                filler.unlink()  # space returns while the job is being ended
        run.wait(60)
    finally:
        stop_process(run)
    incident = json.loads(report.read_text())
    listed = subprocess.run([*WATCHDOG, "incidents", "list", "--json", "--db", str(db)],
                            capture_output=True, text=True, timeout=60, check=True)
    text = "".join(output)
    assert run.returncode == 3, text
    assert f"RANK_STALLED in job {incident['job_id']}" in text
    assert "watchdog: ending the hung job (--on-hang kill)" in text
    assert "cannot store incidents in" in text
    assert [i["id"] for i in json.loads(listed.stdout)] == [incident["id"]]


def test_a_damaged_database_is_moved_aside_and_the_coordinator_serves(tmp_path: Path) -> None:
    db = tmp_path / "incidents.db"
    damaged = b"not a database, whatever it was " * 256
    db.write_bytes(damaged)
    log = tmp_path / "coordinator.log"
    with open(log, "w") as out:
        coordinator = subprocess.Popen(
            [*WATCHDOG, "coordinator", "--listen", f"127.0.0.1:{free_port()}", "--db", str(db)],
            env=job_env(tmp_path), stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_output(coordinator, log.read_text, "listening on")
    finally:
        stop_process(coordinator)
    (aside,) = tmp_path.glob("incidents.db.damaged-*")
    listed = subprocess.run([*WATCHDOG, "incidents", "list", "--json", "--db", str(db)],
                            capture_output=True, text=True, timeout=60, check=True)
    assert coordinator.returncode == 0, log.read_text()
    assert f"is damaged (file is not a database): moved aside to {aside}" in log.read_text()
    assert aside.read_bytes() == damaged
    assert listed.stdout.strip() == "[]"
