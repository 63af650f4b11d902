"""Shared by the integration tests: real torchrun jobs under the real `watchdog` CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.stacks import find_py_spy
from watchdog.errors import PtraceDeniedError

JOB_TIMEOUT_S = 240
WATCHDOG = [sys.executable, "-m", "watchdog"]


@dataclass
class WatchedRun:
    returncode: int
    output: str
    incident: dict[str, Any] | None

    def rank(self, rank: int) -> dict[str, Any]:
        assert self.incident is not None
        return next(r for r in self.incident["ranks"] if r["rank"] == rank)

    def stack_functions(self, rank: int) -> list[str]:
        return [frame["function"] for frame in self.rank(rank)["stack"]]


def job_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "WATCHDOG_BEACON_DIR": str(tmp_path / "beacons"),
            "WATCHDOG_DB": str(tmp_path / "incidents.db"), "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def stop_process(proc: subprocess.Popen[str], grace: float = 20.0) -> str:
    """SIGTERM, then SIGKILL after `grace` seconds; returns what the process printed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.communicate()[0]


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
