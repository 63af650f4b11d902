"""What a new user meets in their first hour with `watchdog run` (issue 41): an output path that
cannot be written never stops `--on-hang kill`, the closing line says where the incidents really
are and suggests commands that work as printed, and `watchdog explain` of the run's own output
names the rank that raised, not its victims (real 2-rank torchrun jobs, gloo, default
thresholds)."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.harness import (
    EXIT_HANG_KILLED,
    JOB_TIMEOUT_S,
    WATCHDOG,
    assert_nothing_left,
    job_env,
    stop_process,
    stored,
)
from watchdog.cli.demo import torchrun_command

REFUSED_DB = "/proc/self/incidents.db"  # a directory no one, root included, may add a file to


def run_acting(args: list[str], tmp_path: Path, marker: str,
               act: Callable[[], object]) -> tuple[int, str]:
    """`watchdog run ARGS`, and `act()` once it printed `marker`: its exit code and output."""
    run = subprocess.Popen([*WATCHDOG, "run", *args], env=job_env(tmp_path),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.stdout is not None
    output = ""
    try:
        while marker not in output:
            line = run.stdout.readline()
            assert line, output
            output += line
        act()
        output += run.communicate(timeout=JOB_TIMEOUT_S)[0]
    finally:
        if run.returncode is None:  # not ended by itself: the rest of what it printed
            output += stop_process(run)
    return run.returncode, output


def test_a_report_path_gone_mid_run_fails_alone_and_the_hung_job_is_still_ended(
        tmp_path: Path) -> None:
    """The reports' directory exists when the run starts (checked up front) and is gone when
    the hang is named: each write says so in one line, the job is ended all the same, and the
    command the closing line suggests, with the run's own --db, works as printed."""
    reports, db = tmp_path / "reports", tmp_path / "own.db"
    reports.mkdir()
    code, output = run_acting(
        ["--on-hang", "kill", "--report", str(reports / "r.json"), "--report-html",
         str(reports / "r.html"), "--db", str(db), "--",
         *torchrun_command(2, "--fault", "data_stall", "--fault-rank", "1", "--fault-step", "3")],
        tmp_path, "watchdog: watching job", reports.rmdir)
    assert code == EXIT_HANG_KILLED, output
    assert f"watchdog: cannot write the JSON report to {reports / 'r.json'}: " in output
    assert f"watchdog: cannot write the HTML report to {reports / 'r.html'}: " in output
    assert "ERROR" not in output and "write_atomically" not in output, output
    last = output.rstrip().splitlines()[-1]
    assert last.startswith("watchdog: ended the hung job after "), output
    suggested = re.search(r"`(watchdog incidents show [^`]+)`", last)
    assert suggested is not None, last
    assert f"--db {db}" in suggested.group(1)
    shown = subprocess.run([*WATCHDOG, *shlex.split(suggested.group(1))[1:]],
                           env=job_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "MISSING_RANKS" in shown.stdout
    assert_nothing_left(tmp_path)


@pytest.fixture(scope="module")
def raised(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Rank 1 of 2 raises at step 2, under `watchdog run` whose database refuses every write:
    the run's directory and all it printed."""
    tmp_path = tmp_path_factory.mktemp("raised")
    run = subprocess.run(
        [*WATCHDOG, "run", "--db", REFUSED_DB, "--",
         *torchrun_command(2, "--fault", "crash", "--fault-rank", "1", "--fault-step", "2")],
        env=job_env(tmp_path), capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert run.returncode == 1, run.stderr
    return tmp_path, run.stdout + run.stderr


def test_incidents_the_database_refused_are_not_said_to_be_stored(
        raised: tuple[Path, str]) -> None:
    _, output = raised
    last = output.rstrip().splitlines()[-1]
    assert "rank 1 raised RuntimeError (RANK_EXITED); the watchdog ended nothing" in last, output
    assert last.endswith(f"1 incident (1 exit); not stored: {REFUSED_DB} refused them, and "
                         "they are only printed above"), output
    assert ", stored in " not in output, output  # the log may say it "could not be stored in"


def test_explain_of_the_run_names_the_rank_that_raised_with_its_own_frame(
        raised: tuple[Path, str]) -> None:
    tmp_path, output = raised
    log = tmp_path / "job.log"
    log.write_text(output)
    explained = subprocess.run([*WATCHDOG, "explain", str(log)], capture_output=True, text=True,
                               timeout=60)
    assert explained.returncode == 0, explained.stderr
    first = explained.stdout.rstrip().splitlines()[-1]
    assert re.match(r"first failure: .*job\.log:\d+: rank 1 raised RuntimeError: shard 7 is "
                    r"corrupt: expected 4096 records, found 17, in read_shard at \S*train\.py:\d+",
                    first), explained.stdout


NEVER_INITIALISES = str(Path(__file__).parents[1] / "jobs" / "never_initialises.py")


@pytest.mark.long_job
def test_ranks_that_never_initialise_are_said_so_and_their_finish_contradicts_the_hang(
        tmp_path: Path) -> None:
    """Both ranks sleep before they would call init_process_group (default thresholds): past
    the warm-up the verdict says they never reached torch.distributed; when they then finish
    (exit 0) with nobody acting, the hang is contradicted, and the closing line says so."""
    go = tmp_path / "go"
    code, output = run_acting(["--", *torchrun_command(2)[:-1], NEVER_INITIALISES, str(go)],
                              tmp_path, "watchdog: hang incident ", go.touch)
    assert code == 0, output
    said = r"ranks 0,1 \(rank 0 stuck in <module> at never_initialises\.py:\d+\) never reached "
    assert re.search(r"RANK_STALLED in job .*\n" + said + r"torch\.distributed", output), output
    (incident,) = stored(tmp_path)
    assert incident["kind"] == "RANK_STALLED" and "resumed_at" in incident, incident
    last = output.rstrip().splitlines()[-1]
    assert "with exit code 0; 1 incident (1 hang, 1 of them contradicted by the job)" in last, (
        output)
    assert_nothing_left(tmp_path)
