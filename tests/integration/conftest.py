"""Fixtures for integration tests, and a preflight that stops the run at once, with the fix, when
py-spy is missing or the kernel forbids attaching to a process."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _browser import chromium
from _harness import (  # noqa: F401 (machine_share: a fixture every test here takes)
    JOB_TIMEOUT_S,
    WatchedRun,
    job_env,
    machine_share,
    preflight,
    run_command,
    watched_run,
)

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
    """Runs the bundled training job with one fault (or another `script`) under `watchdog run`
    and torchrun, or under `watchdog run` alone the command `job` where one is given."""

    def run(*train_args: str, nproc: int = 4, watchdog_args: tuple[str, ...] = (
            "--stall-timeout", "3", "--on-hang", "kill"),
            launcher: tuple[str, ...] = (), script: str = TRAIN_SCRIPT,
            job: list[str] | None = None, env: dict[str, str] | None = None) -> WatchedRun:
        report = tmp_path / "incident.json"
        job = job or torchrun_command(nproc, *train_args, launcher=launcher, script=script)
        proc = subprocess.run(run_command(report, job, watchdog_args),
                              env={**job_env(tmp_path), **(env or {})},
                              capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        return watched_run(proc.returncode, proc.stdout + proc.stderr, report)

    return run


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium, one per test module (it takes a second or two to start)."""
    with chromium() as b:
        yield b
