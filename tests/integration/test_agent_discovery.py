"""The agent on real processes: discovery from beacons, verification, exits, the coordinator
address it derives from a job's MASTER_ADDR, and the files a process's output goes to."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.daemon import Agent
from agent.logtail import read_tail
from agent.procfs import output_files

WORKER = """
import os, sys, time
from watchdog.beacon import BeaconWriter, Identity, beacon_path
from watchdog.beacondir import user_dir
identity = Identity("job-x", 3, 1, 4, "host", os.getpid(), time.time())
fd, directory = user_dir(sys.argv[1])
writer = BeaconWriter(beacon_path(directory, "job-x", 3, os.getpid()), identity, fd)
writer.heartbeat(time.time())
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
           "MASTER_ADDR": "10.9.8.7", "MASTER_PORT": "29500"}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


def test_agent_finds_verifies_and_sees_the_exit(worker: subprocess.Popen[str],
                                                tmp_path: Path) -> None:
    agent = Agent(None, str(tmp_path), "node-a", scan_unhooked=False)
    (state,) = agent.scan().ranks
    assert (state.job_id, state.rank, state.pid, state.hooked) == ("job-x", 3, worker.pid, True)
    assert state.alive and state.proc_state in ("S", "R")
    assert agent.table.find("job-x", 3) is not None  # verified
    worker.kill()
    worker.wait()
    (state,) = agent.scan().ranks
    assert not state.alive
    assert state.exit_code is None  # killed: no clean shutdown was recorded
    assert state.exited_at is not None and state.exited_at <= time.time()


def test_a_root_agent_never_follows_a_jobs_master_addr(worker: subprocess.Popen[str],
                                                       tmp_path: Path) -> None:
    """Any user's job names its MASTER_ADDR: a root agent stays on loopback (or --coordinator)."""
    assert os.geteuid() == 0
    agent = Agent(None, str(tmp_path), "node-a", scan_unhooked=False)
    assert agent.scan().ranks[0].job_id == "job-x"  # the job with MASTER_ADDR 10.9.8.7 is seen
    agent._choose_coordinator()
    assert agent.coordinator == "127.0.0.1:29450"
    pinned = Agent("coord:1234", str(tmp_path), "node-a", scan_unhooked=False)
    pinned.scan()
    pinned._choose_coordinator()
    assert pinned.coordinator == "coord:1234"


def test_a_beacon_whose_rank_disagrees_with_the_process_is_not_verified(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "5", "WORLD_SIZE": "8"}  # the beacon says rank 3
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        agent = Agent(None, str(tmp_path), "node-a", scan_unhooked=False)
        assert agent.scan().ranks == ()  # never reported, never attached to
        assert agent.table.find("job-x", 3) is None
    finally:
        proc.kill()
        proc.wait()


def test_output_files_are_read_through_the_process(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    script = "import sys, time; print('to the file', flush=True); time.sleep(30)"
    with log.open("w") as out:
        to_file = subprocess.Popen([sys.executable, "-c", script], stdout=out,
                                   stderr=subprocess.STDOUT)
    to_pipe = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    try:
        while log.stat().st_size == 0:
            assert to_file.poll() is None
            time.sleep(0.01)
        (path,) = output_files(to_file.pid)  # stdout and stderr: one file, read once
        log.rename(tmp_path / "renamed.log")  # the fd link still opens it
        assert read_tail(path) == ["to the file"]
        assert output_files(to_pipe.pid) == []
        assert output_files(2**22 + 12345) == []  # no such process
    finally:
        for proc in (to_file, to_pipe):
            proc.kill()
            proc.wait()
