"""`watchdog run` passes Ctrl-C and SIGTERM to the job, and a second one ends the job at once;
the user's Ctrl-C is an interrupt (exit 130), never a hang. Around the job it says what it
watches, what to do after a hang it leaves running, and how the run ended, or that nothing was
watched (real torchrun jobs of 2 ranks at default settings)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.helpers.harness import (
    JOB_TIMEOUT_S,
    WATCHDOG,
    assert_nothing_left,
    job_env,
    stop_process,
    stored,
)
from watchdog.cli.demo import torchrun_command

INTERRUPTED = 130  # `watchdog run` after the user's Ctrl-C, whatever the job made of it


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
    assert run.returncode == INTERRUPTED, output
    assert "watchdog: second signal: killing the job" in output
    try:
        os.kill(job_pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"the job (pid {job_pid}) outlived `watchdog run`")


def start_watched(tmp_path: Path, *cmd: str) -> subprocess.Popen[str]:
    """`watchdog run -- CMD` at default settings, leading a process group of its own as a
    shell's foreground job does."""
    return subprocess.Popen([*WATCHDOG, "run", "--", *cmd], env=job_env(tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def read_until(run: subprocess.Popen[str], marker: str) -> str:
    """What run said up to `marker`; fails once the run ended, or was ended (SIGTERM, which it
    passes on to the job) after JOB_TIMEOUT_S without saying it."""
    assert run.stdout is not None
    output = ""
    deadline = threading.Timer(JOB_TIMEOUT_S, run.terminate)
    deadline.start()
    try:
        while marker not in output:
            line = run.stdout.readline()
            assert line, f"run ended before saying {marker!r}:\n{output}"
            output += line
    finally:
        deadline.cancel()
    return output


def ctrl_c(run: subprocess.Popen[str]) -> str:
    """Ctrl-C as a terminal sends it (SIGINT to the foreground group); what run said after."""
    os.killpg(run.pid, signal.SIGINT)
    return run.communicate(timeout=JOB_TIMEOUT_S)[0]


def test_ctrl_c_on_a_healthy_job_is_an_interrupt_not_a_hang(tmp_path: Path) -> None:
    """torchrun passes SIGINT on to its workers, which raise KeyboardInterrupt (or die of the
    signal before they can print it: torchrun may end them first): no rank is to blame, and no
    incident is stored."""
    run = start_watched(tmp_path, *torchrun_command(2, "--steps", "100000"))
    try:
        output = read_until(run, "watchdog: watching job")
        output += ctrl_c(run)
    finally:
        stop_process(run)
    assert "2 of 2 ranks report; hung after 10 s without progress (5 x the job's pace if " \
           "longer; up to 60 s at start-up)" in output
    assert run.returncode == INTERRUPTED, output
    assert "RANK_EXITED" not in output
    assert stored(tmp_path) == []
    last = output.rstrip().splitlines()[-1]
    assert re.fullmatch(r"watchdog: the job ended after \d+ s, interrupted \(exit code 130\); "
                        r"no incident", last), output
    assert_nothing_left(tmp_path)


def test_after_a_hang_it_leaves_running_it_says_what_to_do(tmp_path: Path) -> None:
    """`--on-hang report`, the default: the incident's id, that the job is still hung and how
    to end it or see the incident; the Ctrl-C that it suggests then ends the run."""
    run = start_watched(tmp_path, *torchrun_command(
        2, "--fault", "data_stall", "--fault-rank", "1", "--fault-step", "3"))
    try:
        output = read_until(run, "--html report.html")
        output += ctrl_c(run)
    finally:
        stop_process(run)
    (hang,) = stored(tmp_path)  # the hang; the Ctrl-C that ended the job is none
    assert (hang["kind"], hang["culprit_ranks"]) == ("MISSING_RANKS", [1])
    assert (f"watchdog: hang incident {hang['id']} is stored in {tmp_path / 'incidents.db'}. "
            "The job is still hung: Ctrl-C ends it (--on-hang kill would have ended it);\n"
            f"watchdog:   `watchdog incidents show {hang['id']} --html report.html` writes it "
            "as a page") in output
    assert run.returncode == INTERRUPTED, output
    assert output.rstrip().splitlines()[-1].endswith(
        f"interrupted (exit code 130); 1 incident (1 hang), stored in {tmp_path / 'incidents.db'}"
        f": `watchdog incidents show {hang['id']}` shows the latest")
    assert_nothing_left(tmp_path)


def test_a_job_that_never_reported_does_not_look_healthy(tmp_path: Path) -> None:
    """A plain script (no torch.distributed) ran unwatched; a torchrun job whose script does
    not exist failed before any rank reported: the last line says so, and no warning of the
    agent's own comes between the launcher's error and it."""
    plain = subprocess.run([*WATCHDOG, "run", "--", sys.executable, "-c", "print('job: done')"],
                           env=job_env(tmp_path), capture_output=True, text=True,
                           timeout=JOB_TIMEOUT_S)
    assert plain.returncode == 0, plain.stderr
    assert re.match(r"watchdog: the job ended after \d+ s with exit code 0; no rank of it "
                    r"reported, so nothing was watched: a process reports once it is a "
                    r"torch.distributed rank", plain.stderr.rstrip().splitlines()[-1]), plain.stderr
    missing = subprocess.run([*WATCHDOG, "run", "--",
                              *torchrun_command(2, script=str(tmp_path / "nosuch.py"))],
                             env=job_env(tmp_path), capture_output=True, text=True,
                             timeout=JOB_TIMEOUT_S)
    assert missing.returncode == 1, missing.stderr
    assert "No such file or directory" in missing.stderr  # each rank's python says so
    assert " WARNING " not in missing.stderr, missing.stderr
    assert re.match(r"watchdog: the job ended after \d+ s with exit code 1, before any rank of "
                    r"it reached torch.distributed: the cause is in its output above",
                    missing.stderr.rstrip().splitlines()[-1]), missing.stderr
