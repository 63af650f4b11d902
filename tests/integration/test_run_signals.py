"""`watchdog run` passes Ctrl-C and SIGTERM to the job, and a second one ends the job at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers.harness import JOB_TIMEOUT_S, WATCHDOG, job_env, stop_process

KILLED = 128 + signal.SIGKILL  # `watchdog run` exits as the job did: here, killed


def start_run(tmp_path: Path, job: str) -> tuple[subprocess.Popen[str], int]:
    """`watchdog run -- python -c JOB`, once the job says it is ready; and the job's pid."""
    run = subprocess.Popen([*WATCHDOG, "run", "--", sys.executable, "-c", job],
                           env=job_env(tmp_path), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    assert run.stdout is not None
    line = run.stdout.readline()
    assert line.startswith("ready "), line + stop_process(run)
    return run, int(line.split()[1])


def test_a_signal_reaches_the_job_which_ends_as_it_chooses(tmp_path: Path) -> None:
    run, _ = start_run(tmp_path, (
        "import os, signal, sys, time\n"
        "def leave(*_):\n    print('job: cleaning up after SIGTERM', flush=True); sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, leave)\n"
        "print('ready', os.getpid(), flush=True)\n"
        "time.sleep(120)"))
    run.send_signal(signal.SIGTERM)
    output = run.communicate(timeout=JOB_TIMEOUT_S)[0]
    assert run.returncode == 7, output
    assert "job: cleaning up after SIGTERM" in output


def test_a_second_ctrl_c_kills_a_job_that_ignores_the_first(tmp_path: Path) -> None:
    run, job_pid = start_run(tmp_path, (
        "import os, signal, time\n"
        "signal.signal(signal.SIGINT, lambda *_: print('job: ignoring SIGINT', flush=True))\n"
        "print('ready', os.getpid(), flush=True)\n"
        "time.sleep(120)"))
    assert run.stdout is not None
    run.send_signal(signal.SIGINT)
    assert run.stdout.readline() == "job: ignoring SIGINT\n"
    assert run.poll() is None
    run.send_signal(signal.SIGINT)
    output = run.communicate(timeout=JOB_TIMEOUT_S)[0]
    assert run.returncode == KILLED, output
    assert "watchdog: second signal: killing the job" in output
    try:
        os.kill(job_pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"the job (pid {job_pid}) outlived `watchdog run`")
