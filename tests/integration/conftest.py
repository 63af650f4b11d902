"""Fixtures for integration tests, and a preflight that stops the run at once, with the fix, when
py-spy is missing or the kernel forbids attaching to a process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _harness import JOB_TIMEOUT_S, WATCHDOG, WatchedRun, job_env

from agent.stacks import find_py_spy
from watchdog.cli.demo import torchrun_command
from watchdog.demo import TRAIN_SCRIPT
from watchdog.errors import PtraceDeniedError, PySpyMissingError, WatchdogError


def preflight() -> None:
    """py-spy dumps a child of this process, as the agent dumps a worker; WatchdogError if not."""
    py_spy = find_py_spy()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dump = subprocess.run([py_spy, "dump", "--pid", str(child.pid)], capture_output=True,
                              text=True, timeout=30)
    finally:
        child.kill()
        child.wait()
    if dump.returncode != 0:
        raise PtraceDeniedError(f"py-spy could not attach to a process it started: "
                                f"{dump.stderr.strip() or dump.stdout.strip()}")


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
            launcher: tuple[str, ...] = (), script: str = TRAIN_SCRIPT,
            env: dict[str, str] | None = None) -> WatchedRun:
        report = tmp_path / "incident.json"
        cmd = [*WATCHDOG, "run", *watchdog_args, "--report", str(report),
               "--", *torchrun_command(nproc, *train_args, launcher=launcher, script=script)]
        proc = subprocess.run(cmd, env={**job_env(tmp_path), **(env or {})},
                              capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        incident = json.loads(report.read_text()) if report.exists() else None
        return WatchedRun(proc.returncode, proc.stdout + proc.stderr, incident)

    return run
