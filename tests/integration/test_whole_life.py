"""A job's whole life under `watchdog run` at the settings a user gets by default: long phases
(an evaluation on every rank, one rank's checkpoint, evaluations all along a job) are left
alone, and a rank that stops after them is still named once the floor passes, not minutes later
(real torchrun, gloo, py-spy). tests/integration/test_start_up.py has the other end of a life:
a rank stuck before its first step; test_lightning.py the same life under PyTorch Lightning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _harness import FLOOR_S, assert_called_at, fault_time, stored

EXIT_HANG_KILLED = 3
DEFAULTS = ("--on-hang", "kill")


def assert_named_at_the_floor(run: Any, tmp_path: Path) -> list[dict[str, Any]]:
    """Rank 1 blocked in its data pipeline: named as soon as the floor passed; returns the
    notices stored before the hang."""
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["culprit_ranks"]) == ("MISSING_RANKS", [1])
    assert run.incident["waiting_ranks"] == [0, 2, 3]
    assert "read_sample_from_storage" in run.stack_functions(1)
    assert_called_at(FLOOR_S, run.incident["detected_at"], fault_time(run.output, "data_stall"))
    *before, hang = stored(tmp_path)
    assert hang == run.incident
    assert all(incident["severity"] != "hang" for incident in before), before
    return before


def test_a_stall_after_a_30_s_evaluation_is_named_at_the_floor(watch: Any,
                                                                tmp_path: Path) -> None:
    """Every rank evaluates for 30 s at step 40, then rank 1 blocks reading data at step 60."""
    run = watch("--evaluate-every", "40", "--fault-seconds", "30", "--fault", "data_stall",
                "--fault-rank", "1", "--fault-step", "60", watchdog_args=DEFAULTS)
    assert assert_named_at_the_floor(run, tmp_path) == []


def test_a_stall_after_the_third_evaluation_and_a_checkpoint_is_named_at_the_floor(
        watch: Any, tmp_path: Path) -> None:
    """Evaluations every 25 steps and a checkpoint of rank 0 at step 40 while the others wait
    in a barrier, each longer than the floor; then rank 1 blocks at step 80."""
    run = watch("--evaluate-every", "25", "--fault-seconds", "11", "--checkpoint-at", "40",
                "--checkpoint-rank", "0", "--fault", "data_stall", "--fault-rank", "1",
                "--fault-step", "80", watchdog_args=DEFAULTS)
    assert run.output.count("fault evaluation at step") == 3 * 4, run.output
    notices = assert_named_at_the_floor(run, tmp_path)
    assert [(n["kind"], n["culprit_ranks"]) for n in notices] == [("RANK_BUSY", [0])]
