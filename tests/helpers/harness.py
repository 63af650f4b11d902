"""Shared by the integration tests: real torchrun jobs under the real `watchdog` CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.stacks import find_py_spy
from watchdog.errors import PtraceDeniedError

JOB_TIMEOUT_S = 240
WATCHDOG = [sys.executable, "-m", "watchdog"]
WARMUP_S, FLOOR_S = 60.0, 10.0  # --stall-warmup's and --stall-floor's defaults
EXIT_HANG_KILLED = 3  # `watchdog run --on-hang kill` after it killed a hung job
FSDP2 = str(Path(__file__).parents[1] / "jobs" / "fsdp2.py")
AVERAGED = str(Path(__file__).parents[1] / "jobs" / "averaged.py")
COMPILED_STEP = str(Path(__file__).parents[1] / "jobs" / "compiled_step.py")
LIGHTNING_JOB = str(Path(__file__).parents[1] / "jobs" / "lightning_job.py")


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


def lightning_command(*job_args: str) -> list[str]:
    """The Lightning job under Lightning's own launcher: this process is rank 0 and starts the
    others."""
    return [sys.executable, LIGHTNING_JOB, *job_args]


def run_command(report: Path, job: list[str], watchdog_args: tuple[str, ...]) -> list[str]:
    """`watchdog run` with `watchdog_args`, its first hang written to `report`, running `job`."""
    return [*WATCHDOG, "run", *watchdog_args, "--report", str(report), "--", *job]


def watched_run(returncode: int, output: str, report: Path) -> WatchedRun:
    incident = json.loads(report.read_text()) if report.exists() else None
    return WatchedRun(returncode, output, incident)


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


def wait_for_output(proc: subprocess.Popen[bytes], output: Callable[[], str], marker: str,
                    timeout: float = 30.0) -> None:
    """Until a daemon's `output` holds `marker`; fails with that output if it exits first."""
    deadline = time.monotonic() + timeout
    while marker not in output():
        assert proc.poll() is None, f"the daemon exited:\n{output()}"
        assert time.monotonic() < deadline, f"no {marker!r} after {timeout:.0f} s:\n{output()}"
        time.sleep(0.05)


def assert_nothing_left(tmp_path: Path, timeout: float = 15.0) -> None:
    """No process of the job (one with this test's beacon directory in its environment, as
    every rank and DataLoader worker has) outlives its end, a moment for the last SIGKILL aside."""
    marker = f"WATCHDOG_BEACON_DIR={tmp_path / 'beacons'}".encode()
    deadline = time.monotonic() + timeout
    while left := [pid for pid in _pids() if marker in _environ(pid).split(b"\0")]:
        assert time.monotonic() < deadline, f"still running after the job ended: {left}"
        time.sleep(0.2)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:  # gone, or a zombie's
        return b""


def fault_time(output: str, fault: str) -> float:
    """When the job says its fault began (the first rank to say so)."""
    times = re.findall(rf"fault {fault} at step \d+, time ([\d.]+)", output)
    assert times, output
    return min(map(float, times))


def assert_called_at(threshold: float, detected_at: float, began: float) -> None:
    """The stall that began at `began` was named once `threshold` passed, not at a longer
    threshold (the warm-up, or one that start-up inflated). How soon after the threshold is
    measured by tests/bench/detection_latency.py (the floor plus 1.1-1.3 s, the target 2 s), not
    here: on a loaded machine the tick and py-spy's samples take longer, so what follows the
    threshold gets the floor's 10 s of room, still short of any wrong threshold."""
    latency = detected_at - began
    assert latency < threshold + FLOOR_S, f"named {latency:.1f} s after the fault"


def stored(tmp_path: Path) -> list[dict[str, Any]]:
    """Every incident the run stored, oldest first, through `watchdog incidents`."""
    listed = subprocess.run([*WATCHDOG, "incidents", "list", "--json"], env=job_env(tmp_path),
                            capture_output=True, text=True, check=True)
    return list(reversed(json.loads(listed.stdout)))


def warnings(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The stored warnings (findings) by kind; each kind once."""
    found = [i for i in stored(tmp_path) if i["severity"] == "warning"]
    by_kind = {i["kind"]: i for i in found}
    assert len(by_kind) == len(found), found
    return by_kind


def assert_said_once(output: str, incident: dict[str, Any]) -> None:
    """`watchdog run` printed the finding once, with its fix."""
    assert output.count(f"{incident['kind']} in job ") == 1, output
    assert output.count(incident["summary"]) == 1, output
    assert f"fix: {incident['finding']['fix']}" in output


def preflight() -> None:
    """py-spy dumps a child of this process, as the agent dumps a worker; WatchdogError if not."""
    py_spy = find_py_spy()
    # It says when its interpreter runs: dumped any earlier, py-spy finds no Python in it yet.
    child = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); "
                              "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        child.stdout.readline()
        dump = subprocess.run([py_spy, "dump", "--pid", str(child.pid)], capture_output=True,
                              text=True, timeout=30)
    finally:
        child.kill()
        child.wait()
    if dump.returncode != 0:
        raise PtraceDeniedError(f"py-spy could not attach to a process it started: "
                                f"{dump.stderr.strip() or dump.stdout.strip()}")
