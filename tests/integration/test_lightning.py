"""A PyTorch Lightning job (tests/jobs/lightning_job.py: "ddp" on 4 CPU processes, gloo) under
`watchdog run` with the thresholds a user gets by default, started by Lightning's own launcher
(the script starts ranks 1-3 as its subprocesses) and by torchrun: every rank is recorded, a
validation is left alone, and a rank that blocks in its dataset after the validation is named.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from _harness import FLOOR_S, assert_called_at, fault_time, stored

from watchdog.cli.demo import torchrun_command

EXIT_HANG_KILLED = 3
DEFAULTS = ("--on-hang", "kill")  # every threshold at its default; a hang ends the job
LIGHTNING_JOB = str(Path(__file__).parents[1] / "jobs" / "lightning_job.py")
FAULT_STEP = 46  # a few steps after the validation at step 40


def lightning_command(launcher: str, *job_args: str) -> list[str]:
    if launcher == "lightning":
        return [sys.executable, LIGHTNING_JOB, *job_args]
    return torchrun_command(4, *job_args, script=LIGHTNING_JOB)


@pytest.mark.parametrize("launcher", ["lightning", "torchrun"])
def test_a_rank_blocked_in_its_dataset_after_a_validation_is_named(
        watch: Any, launcher: str) -> None:
    """Every rank validates for 30 s at step 40, then rank 1 blocks in its dataset's
    __getitem__; ranks 0, 2 and 3 wait in DDP's all-reduce."""
    run = watch(job=lightning_command(launcher, "--fault-rank", "1", "--fault-step",
                                      str(FAULT_STEP)), watchdog_args=DEFAULTS)
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["severity"]) == ("MISSING_RANKS", "hang")
    assert run.incident["culprit_ranks"] == [1]
    assert run.incident["waiting_ranks"] == [0, 2, 3]
    assert run.incident["collective"]["op"] == "all_reduce"
    # Lightning's launcher starts ranks 1-3 without RANK: each is recorded from its
    # init_process_group on, in the same job, its optimizer steps counted through Lightning's.
    assert sorted(r["rank"] for r in run.incident["ranks"]) == [0, 1, 2, 3]
    assert all(r["step"] >= FAULT_STEP - 2 for r in run.incident["ranks"]), run.incident
    assert run.stack_functions(1)[:2] == ["read_sample_from_storage",
                                           "Samples.__getitem__"]
    assert_called_at(FLOOR_S, run.incident["detected_at"], fault_time(run.output, "data_stall"))


def test_a_healthy_lightning_job_with_a_validation_is_left_alone(
        watch: Any, tmp_path: Path) -> None:
    """Every rank validates for 15 s at step 40: longer than the floor, and no hang."""
    run = watch(job=lightning_command("lightning", "--fault-rank", "-1", "--steps", "50",
                                      "--val-seconds", "15"), watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    assert "finished 50 steps" in run.output
    assert run.incident is None
    assert stored(tmp_path) == []
