"""Fixtures for integration tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _harness import JOB_TIMEOUT_S, WatchedRun, job_env

from watchdog._demo.run_demo import torchrun_command


@pytest.fixture
def watch(tmp_path: Path) -> Any:
    """Runs the bundled training job with one fault under `watchdog run`."""

    def run(*train_args: str, nproc: int = 4, watchdog_args: tuple[str, ...] = (
            "--stall-timeout", "3", "--on-hang", "kill"),
            launcher: tuple[str, ...] = ()) -> WatchedRun:
        report = tmp_path / "incident.json"
        cmd = [sys.executable, "-m", "watchdog", "run", *watchdog_args, "--report", str(report),
               "--", *torchrun_command(nproc, *train_args, launcher=launcher)]
        proc = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True,
                              timeout=JOB_TIMEOUT_S)
        incident = json.loads(report.read_text()) if report.exists() else None
        return WatchedRun(proc.returncode, proc.stdout + proc.stderr, incident)

    return run
