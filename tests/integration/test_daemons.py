"""Agent and coordinator as separate processes on loopback, jobs started by `watchdog launch` or
by plain torchrun (no hook), and `watchdog status` / `watchdog incidents` reading the results."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemons import (
    Daemons,
    end_job,
    job_incidents,
    running,
    start_job,
    wait_for_verdict,
)
from tests.helpers.harness import WATCHDOG, job_env
from watchdog.cli.demo import free_port


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    with running(Daemons, tmp_path) as d:
        yield d


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
