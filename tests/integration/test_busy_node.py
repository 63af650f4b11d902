"""When the machine itself is the problem: a healthy job on a node whose every core is busy with
someone else's work is never reported, and a rank starved of CPU (runnable, not running) is
busy, not hung."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import stored
from watchdog.cli.demo import torchrun_command

STARVED = str(Path(__file__).parents[1] / "jobs" / "starved_rank.py")
# A busy loop at normal priority that ends itself should the test die before it can end it.
HOG = "import time\nend = time.monotonic() + 180\nwhile time.monotonic() < end:\n    pass\n"


@pytest.fixture
def hogs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """One busy loop more than the node has cores."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(len(
        os.sched_getaffinity(0)) + 1)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_healthy_job_on_a_node_whose_cores_are_all_busy_is_never_reported(
        watch: Any, hogs: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    run = watch("--steps", "200", nproc=2, watchdog_args=())  # the defaults a user gets
    assert all(hog.poll() is None for hog in hogs)  # they competed for the cores throughout
    assert run.returncode == 0, run.output
    assert run.incident is None
    assert stored(tmp_path) == []  # no hang, and no notice either


def test_a_rank_starved_of_cpu_is_busy_not_hung(watch: Any, tmp_path: Path) -> None:
    hog_pid = tmp_path / "hog.pid"
    try:
        run = watch(job=torchrun_command(2, str(hog_pid), script=STARVED))
    finally:
        if hog_pid.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(hog_pid.read_text()), signal.SIGKILL)
    assert run.returncode == 0, run.output  # --on-hang kill did not end it
    assert run.incident is None
    found = stored(tmp_path)
    assert len(found) == 1, run.output  # a loaded CI run once stored none: say what run said
    (notice,) = found
    assert (notice["kind"], notice["culprit_ranks"]) == ("RANK_BUSY", [1])
    assert "runnable, waiting for a CPU" in notice["summary"]
    assert "ended_at" in notice  # it moved on once its core was free
