"""Agent and coordinator as separate processes on loopback, a job started by `watchdog launch`,
and `watchdog status` reading the verdict back over gRPC."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _harness import job_env

from watchdog._demo.run_demo import free_port, torchrun_command

WATCHDOG = [sys.executable, "-m", "watchdog"]
DIAGNOSIS_DEADLINE_S = 120


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    out, _ = proc.communicate()
    return out


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[str]:
    address = f"127.0.0.1:{free_port()}"
    env = job_env(tmp_path)
    coordinator = subprocess.Popen(
        [*WATCHDOG, "-v", "coordinator", "--listen", address, "--stall-timeout", "3"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    agent = subprocess.Popen(
        [*WATCHDOG, "-v", "agent", "--coordinator", address, "--interval", "0.25",
         "--node-name", "node-a"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield address
    finally:
        agent_log, coordinator_log = _stop(agent), _stop(coordinator)
        print("--- agent ---\n" + agent_log + "\n--- coordinator ---\n" + coordinator_log)


def status(address: str) -> dict[str, Any] | None:
    """`watchdog status --json`, or None while the coordinator is not up yet."""
    out = subprocess.run([*WATCHDOG, "status", "--json", "--coordinator", address],
                         capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout) if out.returncode == 0 else None


def wait_for_verdict(address: str) -> dict[str, Any]:
    deadline = time.monotonic() + DIAGNOSIS_DEADLINE_S
    while time.monotonic() < deadline:
        jobs = (status(address) or {"jobs": []})["jobs"]
        if jobs and jobs[0]["verdict"] is not None:
            return jobs[0]
        time.sleep(1)
    raise AssertionError(f"no verdict within {DIAGNOSIS_DEADLINE_S}s: {status(address)}")


def test_separate_daemons_diagnose_a_launched_job(daemons: str, tmp_path: Path) -> None:
    job = subprocess.Popen(
        [*WATCHDOG, "launch", "--", *torchrun_command(
            4, "--fault", "data_stall", "--fault-rank", "2", "--fault-step", "4")],
        env=job_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        view = wait_for_verdict(daemons)
        human = subprocess.run([*WATCHDOG, "status", "--coordinator", daemons],
                               capture_output=True, text=True, timeout=30, check=True).stdout
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=60)
    verdict = view["verdict"]
    assert view["state"] == "HUNG"
    assert view["world_size"] == 4
    assert view["nodes"] == ["node-a"]
    assert verdict["kind"] == "MISSING_RANKS"
    assert verdict["culprit_ranks"] == [2]
    assert verdict["collective"]["op"] == "all_reduce"
    culprit = next(r for r in verdict["ranks"] if r["rank"] == 2)
    assert "read_sample_from_storage" in [f["function"] for f in culprit["stack"]]
    assert sorted(r["rank"] for r in view["ranks"]) == [0, 1, 2, 3]
    assert "HUNG" in human
    assert "rank 2 (stuck in read_sample_from_storage at train.py:" in human
    assert "never reached all_reduce #" in human


def test_status_without_coordinator_fails_clearly(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    out = subprocess.run([*WATCHDOG, "status", "--coordinator", address],
                         capture_output=True, text=True, timeout=60, env=job_env(tmp_path))
    assert out.returncode == 1
    assert "watchdog coordinator" in out.stderr  # the hint says how to start one
