"""A job's whole life under `watchdog run` at the settings a user gets by default: long phases
(a slow first step, an evaluation on every rank, one rank's checkpoint, evaluations all along a
job) are left alone, and a rank that stops after them is still named once the floor passes, not
minutes later (real torchrun, gloo, py-spy). tests/integration/test_start_up.py has the other
end of a life: a rank stuck before its first step; test_lightning.py the same life under
PyTorch Lightning."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import (
    EXIT_HANG_KILLED,
    FLOOR_S,
    JOB_TIMEOUT_S,
    assert_called_at,
    fault_time,
    job_env,
    run_command,
    stored,
    wait_for_output,
    watched_run,
)
from watchdog.cli.demo import torchrun_command
from watchdog.coordinator.node_silence import NODE_TIMEOUT_S

pytestmark = pytest.mark.long_job  # each job lives through long phases

DEFAULTS = ("--on-hang", "kill")
NPROC = 3  # a culprit and a majority waiting on it: a fourth rank would add CPU, not a case


def assert_named_at_the_floor(run: Any, tmp_path: Path) -> list[dict[str, Any]]:
    """Rank 1 blocked in its data pipeline: named as soon as the floor passed; returns the
    notices stored before the hang."""
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["culprit_ranks"]) == ("MISSING_RANKS", [1])
    assert run.incident["waiting_ranks"] == [0, 2]
    assert "read_sample_from_storage" in run.stack_functions(1)
    assert_called_at(FLOOR_S, run.incident["detected_at"], fault_time(run.output, "data_stall"))
    *before, hang = stored(tmp_path)
    assert hang == run.incident
    assert all(incident["severity"] != "hang" for incident in before), before
    return before


def test_a_stall_after_a_slow_first_step_and_a_30_s_evaluation_is_named_at_the_floor(
        watch: Any, tmp_path: Path) -> None:
    """Every rank works 15 s before its first step and evaluates for 30 s at step 40, both left
    alone (no verdict, no notice); then rank 1 blocks reading data at step 60."""
    run = watch("--slow-start", "15", "--evaluate-every", "40", "--fault-seconds", "30",
                "--fault", "data_stall", "--fault-rank", "1", "--fault-step", "60",
                nproc=NPROC, watchdog_args=DEFAULTS)
    assert run.output.count("fault evaluation at step") == NPROC, run.output
    assert assert_named_at_the_floor(run, tmp_path) == []


def test_a_stall_after_the_third_evaluation_and_a_checkpoint_is_named_at_the_floor(
        watch: Any, tmp_path: Path) -> None:
    """Evaluations every 25 steps and a checkpoint of rank 0 at step 40 while the others wait
    in a barrier, each longer than the floor; then rank 1 blocks at step 80."""
    run = watch("--evaluate-every", "25", "--fault-seconds", "11", "--checkpoint-at", "40",
                "--checkpoint-rank", "0", "--fault", "data_stall", "--fault-rank", "1",
                "--fault-step", "80", nproc=NPROC, watchdog_args=DEFAULTS)
    assert run.output.count("fault evaluation at step") == 3 * NPROC, run.output
    notices = assert_named_at_the_floor(run, tmp_path)
    # The 11 s checkpoint and evaluations outlast the 10 s floor by less than a diagnosis takes
    # on a loaded machine: the checkpoint's notice (rank 0 busy, its peers waiting) may not
    # come, and an evaluation that one rank ends first may bring one for the others: notices,
    # never a hang (assert_named_at_the_floor).
    assert all(n["kind"] == "RANK_BUSY" for n in notices), notices


def test_a_stall_after_short_evaluations_that_recur_is_named_at_the_floor(
        watch: Any, tmp_path: Path) -> None:
    """Every 4 steps every rank evaluates for 5 s, under the floor: six times, then rank 1
    blocks reading data at step 24, in another place. The evaluations are phases, never the
    training's pace: 5 x 5 s would have been the threshold."""
    run = watch("--evaluate-every", "4", "--fault-seconds", "5", "--fault", "data_stall",
                "--fault-rank", "1", "--fault-step", "24", nproc=NPROC, watchdog_args=DEFAULTS)
    assert run.output.count("fault evaluation at step") == 6 * NPROC, run.output
    assert assert_named_at_the_floor(run, tmp_path) == []


def test_a_watchdog_paused_through_a_stall_blames_the_rank_not_its_node(tmp_path: Path) -> None:
    """The watchdog itself stops (SIGSTOP: a paused machine, a starved process) for longer than
    a node may stay silent, while rank 1 blocks; woken, it names rank 1, not its own node."""
    log = tmp_path / "watchdog.log"
    job = torchrun_command(NPROC, "--fault", "data_stall", "--fault-rank", "1", "--fault-step", "6")
    with open(log, "w") as out:
        proc = subprocess.Popen(run_command(tmp_path / "incident.json", job, DEFAULTS),
                                env=job_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_output(proc, log.read_text, "fault data_stall at step", timeout=JOB_TIMEOUT_S)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(NODE_TIMEOUT_S + 2.0)
        proc.send_signal(signal.SIGCONT)
        proc.wait(JOB_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    run = watched_run(proc.returncode, log.read_text(), tmp_path / "incident.json")
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["culprit_ranks"]) == ("MISSING_RANKS", [1])
    assert "the coordinator did not run for" in run.output
