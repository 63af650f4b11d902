"""Agent and coordinator as separate processes on loopback, jobs started by `watchdog launch` or
by plain torchrun (no hook), and `watchdog status` / `watchdog incidents` reading the results."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _harness import WATCHDOG, job_env, stop_process, stored

from watchdog.cli.demo import free_port, torchrun_command

DIAGNOSIS_DEADLINE_S = 120
JOB_ID = "daemons-test-job"


class Daemons:
    """One coordinator and one agent, each of which a test may kill and restart."""

    def __init__(self, tmp_path: Path) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.env = job_env(tmp_path)
        self.logs: list[str] = []
        self.coordinator = self.start_coordinator()
        self.agent = self._spawn("agent", "--coordinator", self.address, "--interval", "0.25",
                                 "--node-name", "node-a")

    def _spawn(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*WATCHDOG, *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def start_coordinator(self) -> subprocess.Popen[str]:
        return self._spawn("coordinator", "--listen", self.address, "--stall-timeout", "3")

    def kill_coordinator(self) -> None:
        self.coordinator.kill()  # SIGKILL: no chance to clean up
        self.logs.append(self.coordinator.communicate()[0])

    def stop(self) -> None:
        self.logs += [stop_process(proc) for proc in (self.agent, self.coordinator)]


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    d = Daemons(tmp_path)
    try:
        yield d
    finally:
        d.stop()
        print("\n---\n".join(d.logs))


def status(address: str) -> dict[str, Any] | None:
    """`watchdog status --json`, or None while the coordinator is not up yet."""
    out = subprocess.run([*WATCHDOG, "status", "--json", "--coordinator", address],
                         capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout) if out.returncode == 0 else None


def wait_for_verdict(address: str) -> dict[str, Any]:
    """The view of this test's job once it has a verdict (the agent sees every torchrun job on
    the machine; this one is known by its WATCHDOG_JOB_ID)."""
    deadline = time.monotonic() + DIAGNOSIS_DEADLINE_S
    while time.monotonic() < deadline:
        jobs = (status(address) or {"jobs": []})["jobs"]
        ours = [job for job in jobs if job["job_id"] == JOB_ID]
        if ours and ours[0]["verdict"] is not None:
            return ours[0]
        time.sleep(1)
    raise AssertionError(f"no verdict within {DIAGNOSIS_DEADLINE_S}s: {status(address)}")


def start_job(tmp_path: Path, *prefix: str) -> subprocess.Popen[str]:
    """The demo job with rank 2 stuck in its data pipeline; `prefix` may inject the hook."""
    cmd = [*prefix, *torchrun_command(4, "--fault", "data_stall", "--fault-rank", "2",
                                      "--fault-step", "4")]
    return subprocess.Popen(cmd, env={**job_env(tmp_path), "WATCHDOG_JOB_ID": JOB_ID},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def end_job(job: subprocess.Popen[str]) -> None:
    job.send_signal(signal.SIGTERM)
    job.communicate(timeout=60)


def job_incidents(tmp_path: Path) -> list[dict[str, Any]]:
    """The stored incidents of this test's job (the agent sees other tests' jobs too)."""
    return [incident for incident in stored(tmp_path) if incident["job_id"] == JOB_ID]


def culprit_functions(verdict: dict[str, Any]) -> list[str]:
    (culprit,) = verdict["culprit_ranks"]
    row = next(r for r in verdict["ranks"] if r["rank"] == culprit)
    return [f["function"] for f in row["stack"]]


def test_separate_daemons_diagnose_a_launched_job(daemons: Daemons, tmp_path: Path) -> None:
    job = start_job(tmp_path, *WATCHDOG, "launch", "--")
    try:
        view = wait_for_verdict(daemons.address)
        human = subprocess.run([*WATCHDOG, "status", "--coordinator", daemons.address],
                               capture_output=True, text=True, timeout=30, check=True).stdout
    finally:
        end_job(job)
    verdict = view["verdict"]
    assert view["state"] == "HUNG"
    assert view["world_size"] == 4
    assert view["nodes"] == ["node-a"]
    assert verdict["kind"] == "MISSING_RANKS"
    assert verdict["culprit_ranks"] == [2]
    assert verdict["collective"]["op"] == "all_reduce"
    assert "read_sample_from_storage" in culprit_functions(verdict)
    assert sorted(r["rank"] for r in view["ranks"]) == [0, 1, 2, 3]
    assert "HUNG" in human
    assert "rank 2 (stuck in read_sample_from_storage at train.py:" in human
    assert "never reached all_reduce #" in human


@pytest.mark.unhooked_job
def test_job_without_hook_is_diagnosed_from_stacks(daemons: Daemons, tmp_path: Path) -> None:
    job = start_job(tmp_path)  # plain torchrun: the agent finds the workers in /proc
    try:
        view = wait_for_verdict(daemons.address)
    finally:
        end_job(job)
    verdict = view["verdict"]
    assert verdict["culprit_ranks"] == [2]
    assert verdict["kind"] in ("MISSING_RANKS", "RANK_STALLED")
    assert verdict["waiting_ranks"] == [0, 1, 3]
    assert "read_sample_from_storage" in culprit_functions(verdict)
    assert all(r["last_collective"] is None for r in verdict["ranks"])  # no hook: no counters


def test_coordinator_killed_mid_hang_keeps_the_incident_once(daemons: Daemons,
                                                             tmp_path: Path) -> None:
    job = start_job(tmp_path, *WATCHDOG, "launch", "--")
    try:
        first = wait_for_verdict(daemons.address)["verdict"]
        stored_before = job_incidents(tmp_path)
        daemons.kill_coordinator()
        daemons.coordinator = daemons.start_coordinator()
        again = wait_for_verdict(daemons.address)["verdict"]  # the agent reconnected, resent
    finally:
        end_job(job)
    assert again == first
    stored_after = job_incidents(tmp_path)
    assert stored_after == stored_before  # the same across the restart
    (kept,) = stored_after
    assert kept == first


def test_status_without_coordinator_fails_clearly(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    out = subprocess.run([*WATCHDOG, "status", "--coordinator", address],
                         capture_output=True, text=True, timeout=60, env=job_env(tmp_path))
    assert out.returncode == 1
    assert "watchdog coordinator" in out.stderr  # the hint says how to start one
