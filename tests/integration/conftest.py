"""Fixtures for integration tests, and a preflight that stops the run at once, with the fix, when
py-spy is missing or the kernel forbids attaching to a process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _harness import JOB_TIMEOUT_S, WATCHDOG, WatchedRun, job_env, preflight

from watchdog.cli.demo import torchrun_command
from watchdog.demo import TRAIN_SCRIPT
from watchdog.errors import PtraceDeniedError, PySpyMissingError, WatchdogError


def pytest_configure(config: pytest.Config) -> None:
    try:
        preflight()
    except (PySpyMissingError, PtraceDeniedError, WatchdogError) as e:
        pytest.exit(f"integration tests need py-spy and ptrace: {e}", returncode=4)


@pytest.fixture
def watch(tmp_path: Path) -> Any:
    """Runs the bundled training job with one fault (or another `script`) under `watchdog run`."""

    def run(*train_args: str, nproc: int = 4, watchdog_args: tuple[str, ...] = (
            "--stall-timeout", "3", "--on-hang", "kill"),
            launcher: tuple[str, ...] = (), script: str = TRAIN_SCRIPT) -> WatchedRun:
        report = tmp_path / "incident.json"
        cmd = [*WATCHDOG, "run", *watchdog_args, "--report", str(report),
               "--", *torchrun_command(nproc, *train_args, launcher=launcher, script=script)]
        proc = subprocess.run(cmd, env=job_env(tmp_path), capture_output=True, text=True,
                              timeout=JOB_TIMEOUT_S)
        incident = json.loads(report.read_text()) if report.exists() else None
        return WatchedRun(proc.returncode, proc.stdout + proc.stderr, incident)

    return run
