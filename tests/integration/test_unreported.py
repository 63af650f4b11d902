"""A job whose processes never report, under `watchdog run` at default settings: after the
warm-up it says that it watches nothing, why (from the workers' own flags), and what to do,
and leaves the job alone (real torchrun)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.harness import JOB_TIMEOUT_S, WARMUP_S, WATCHDOG, job_env, stored
from watchdog.cli.demo import torchrun_command

pytestmark = pytest.mark.long_job  # it waits out the warm-up

WAIT_FOR_FILE = str(Path(__file__).parents[1] / "jobs" / "wait_for_file.py")
SAID = "watchdog: nothing the command started reported in"


def test_workers_started_with_python_S_never_report_and_run_says_why(tmp_path: Path) -> None:
    """torchrun starts `python -S` workers: no site module, so no hook. Their environment is
    still the one `watchdog run` set (WATCHDOG_AUTOINSTALL=1), so no node agent takes them for
    an unhooked job."""
    release = tmp_path / "release"
    job = torchrun_command(2, "-S", WAIT_FOR_FILE, str(release), launcher=("--no-python",),
                           script=sys.executable)
    proc = subprocess.Popen([*WATCHDOG, "run", "--", *job], env=job_env(tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    output = ""
    try:
        while SAID not in output or "to watch it:" not in output:
            line = proc.stdout.readline()
            assert line, f"run ended before saying the job never reported:\n{output}"
            output += line
        release.touch()  # the job ends only once run said it: said while it ran
        output += proc.communicate(timeout=JOB_TIMEOUT_S)[0]
    finally:
        proc.kill()
    assert proc.returncode == 1, output  # torchrun's own, for workers that exited with 7
    assert re.search(r"exitcode\s*:\s*7", output), output
    assert f"{SAID} {WARMUP_S:.0f} s: no rank of it is watched" in output
    assert re.search(r"^watchdog:   2 torchrun workers \(pids \d+,\d+\): started with python -S, "
                     r"which skips the site module that loads the hook$", output, re.MULTILINE)
    assert "`watchdog launch -- CMD`" in output and "watchdog.install()" in output
    assert "`watchdog doctor`" in output
    assert "watching job" not in output
    assert stored(tmp_path) == []
