"""A PyTorch Lightning job (tests/jobs/lightning_job.py: "ddp" on 4 CPU processes, gloo) under
`watchdog run` with the thresholds a user gets by default, started by Lightning's own launcher
(the script starts ranks 1-3 as its subprocesses): every rank is recorded, a validation is left
alone, and a rank that blocks in its dataset after the validation is named. The same job runs
under torchrun (`torchrun --nproc_per_node=4 tests/jobs/lightning_job.py`) with the same result;
the suite runs the launcher that differs from the demo's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import (
    EXIT_HANG_KILLED,
    FLOOR_S,
    assert_called_at,
    fault_time,
    lightning_command,
    stored,
)

pytestmark = pytest.mark.long_job  # Lightning takes long to start on each rank

DEFAULTS = ("--on-hang", "kill")  # every threshold at its default; a hang ends the job
FAULT_STEP = 46  # a few steps after the validation at step 40


def test_a_rank_blocked_in_its_dataset_after_a_validation_is_named(
        watch: Any, tmp_path: Path) -> None:
    """Every rank validates for 15 s at step 40, then rank 1 blocks in its dataset's
    __getitem__; ranks 0, 2 and 3 wait in DDP's all-reduce."""
    run = watch(job=lightning_command("--fault-rank", "1", "--fault-step",
                                      str(FAULT_STEP), "--val-seconds", "15"),
                watchdog_args=DEFAULTS)
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
    # The validation itself, longer than the floor, was left alone: the hang is all there is.
    assert stored(tmp_path) == [run.incident]

