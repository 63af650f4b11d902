"""The agent's worker table in this process: what a report carries of a rank's checks, and
that a report entry is converted from what the last refresh observed."""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import beaconfiles, exits
from agent.rankstate import rank_state
from agent.table import WorkerTable
from agent.worker import FINGERPRINT_REPORTS, Worker
from watchdog.beacon import (
    BeaconSnapshot,
    BeaconWriter,
    CheckState,
    Fingerprint,
    Identity,
    beacon_path,
)
from watchdog.beacon.layout import OFF_IDENTITY
from watchdog.model import NO_ACTIVITY, Activity


def test_a_ranks_fingerprints_go_out_in_the_few_reports_after_it_took_one(
        tmp_path: Path) -> None:
    own = tmp_path / str(os.geteuid())  # the agent reads only users' own subdirectories
    own.mkdir(mode=0o755)
    path = beacon_path(str(own), "job", 0, os.getpid())
    writer = BeaconWriter(path, Identity("job", 0, 0, 2, "host", os.getpid(), time.time() - 1))
    table = WorkerTable(str(tmp_path), scan_unhooked=False)

    def reports(taken: int, n: int) -> list[int]:
        prints = tuple(Fingerprint("parameters", "0", 0, 8 * k, k) for k in range(1, taken + 1))
        writer.publish(8 * taken, [], {}, time.time(),
                       checks=CheckState(("replica_desync",), taken, prints))
        carried = []
        for _ in range(n):
            table.refresh(time.time())
            (worker,) = table.workers()
            state = rank_state(worker, time.time())
            assert state.evidence.checks == ("replica_desync",)
            carried.append(len(state.evidence.fingerprints))
        return carried

    assert reports(1, FINGERPRINT_REPORTS + 2) == [1] * FINGERPRINT_REPORTS + [0, 0]
    assert reports(2, 1) == [2]


def test_a_compile_under_way_goes_out_as_its_age_on_the_agents_clock(tmp_path: Path) -> None:
    own = tmp_path / str(os.geteuid())
    own.mkdir(mode=0o755)
    writer = BeaconWriter(beacon_path(str(own), "job", 0, os.getpid()),
                          Identity("job", 0, 0, 2, "host", os.getpid(), time.time() - 1))
    table = WorkerTable(str(tmp_path), scan_unhooked=False)
    began = time.time()
    ages = []
    for since in (began, 0.0):
        writer.publish(0, [], {}, time.time(), compiling_since=since)
        table.refresh(time.time())
        (worker,) = table.workers()
        ages.append(rank_state(worker, began + 7.0).compile_age)
    assert ages == [7.0, None]


def test_a_report_entry_is_a_conversion_that_reads_nothing() -> None:
    """rank_state reads no /proc and counts no report: what it says is what the refresh saw."""
    gone = 2**22 + 12345  # no such process: a /proc read would say "" and no activity
    busy = Activity(3.0, 0.9, 1.0, 0.0, 0.0)
    worker = Worker(Identity("job", 1, 1, 2, "host", gone, time.time() - 5), 0,
                    proc_state="R", activity=busy)
    first, second = rank_state(worker, 100.0), rank_state(worker, 100.0)
    assert first == second
    assert (first.proc_state, first.activity, first.hooked) == ("R", busy, False)


def test_observing_a_process_reads_the_proc_root_it_is_given(tmp_path: Path) -> None:
    worker = Worker(Identity("job", 0, 0, 1, "host", os.getpid(), time.time() - 5), 0)
    worker.observe(time.time(), None)
    assert worker.proc_state  # this process, in the real /proc
    worker.observe(time.time(), None, proc=str(tmp_path))
    assert (worker.proc_state, worker.activity) == ("", NO_ACTIVITY)  # no such process there


def test_a_beacon_its_owner_keeps_unreadable_is_said_once_until_it_reads_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    own = tmp_path / str(os.geteuid())
    own.mkdir(mode=0o755)
    writer = BeaconWriter(beacon_path(str(own), "job", 0, os.getpid()),
                          Identity("job", 0, 0, 2, "host", os.getpid(), time.time() - 1))
    writer.group_slot("0", (0, 1), 2)  # the whole world
    table = WorkerTable(str(tmp_path), scan_unhooked=False)
    table.refresh(time.time())
    (worker,) = table.workers()

    def claim_world(world: int, refreshes: int) -> None:
        with open(writer.path, "r+b") as f:
            os.pwrite(f.fileno(), struct.pack("<i", world), OFF_IDENTITY + 12)
        for _ in range(refreshes):
            table.refresh(time.time())

    with caplog.at_level(logging.WARNING, "agent.table"):
        claim_world(1 << 20, 3)  # past the largest job: its whole-world group is refused
        claim_world(2, 1)
        claim_world(1 << 20, 2)
    assert caplog.text.count("rank 0 of job: beacon group slot 0 lists -1 ranks") == 2
    assert worker.snapshot is not None and worker.snapshot.groups[0].ranks == range(2)


def test_a_scan_after_the_exits_are_closed_reads_none_and_says_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A stopping agent closes its exit sources while a scan may still be running in its
    thread: that scan must not read the closed sources (EBADF, and a warning printed after
    `watchdog run`'s last line)."""
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1,1,-;a record\n")
    kernel = exits.KernelLog.open(str(log))
    assert kernel is not None
    table = WorkerTable(str(tmp_path), scan_unhooked=False,
                        observer=exits.ExitObserver(exits.ProcessEvents.open(), kernel))
    table.refresh(time.time())
    table.close_exits()
    with caplog.at_level(logging.WARNING):
        table.refresh(time.time())
    assert caplog.records == []


def test_an_exit_is_noted_with_the_hooks_last_publish_that_came_after_the_pass_read_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's hook publishes its clean exit, and the process ends, between a pass's read of
    its beacon and that pass's look at the process: the exit goes out as the hook recorded it,
    not with the stale read (clean_exit false: a CI run blamed a rank that finished cleanly
    at the end of a healthy job, RANK_EXITED)."""
    env = {**os.environ, "WATCHDOG_BEACON_DIR": str(tmp_path), "WATCHDOG_JOB_ID": "job",
           "RANK": "0", "WORLD_SIZE": "2", "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("WATCHDOG_AUTOINSTALL", None)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, watchdog; watchdog.install(); watchdog.step(); "
         "print(flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdin is not None
        child.stdout.readline()  # installed
        table = WorkerTable(str(tmp_path), scan_unhooked=False)
        table.refresh(time.time())
        (worker,) = table.workers()
        read = beaconfiles.read

        def read_then_exit(fd: int) -> BeaconSnapshot:
            snap = read(fd)
            if child.poll() is None:
                child.stdin.close()  # type: ignore[union-attr]
                child.wait(timeout=30)
            return snap

        monkeypatch.setattr(beaconfiles, "read", read_then_exit)
        table.refresh(time.time())
    finally:
        child.kill()
        child.wait()
    state = rank_state(worker, time.time())
    assert (state.alive, state.clean_exit, state.exit_code, state.steps) == (False, True, 0, 1)
