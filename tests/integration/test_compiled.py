"""torch.compile under `watchdog run` at the settings a user gets, with caches as cold as a fresh
node's (a TMPDIR and TORCHINDUCTOR_CACHE_DIR of each test's own): compiling is work, never a hang,
whether at the first step, at an evaluation pass or at a new shape mid-training; one job lives
through all three, then a rank blocks, and only that is named, once the floor passes (real
torchrun, gloo, inductor with gcc, py-spy). tests/jobs/compiled.py is the job;
tests/unit/test_compiling.py has the stacks of such ranks as the coordinator judges them. And
the hook stays out of the user's compiled code: a compiled training step
(tests/jobs/compiled_step.py) is never recompiled for it, and every step is still counted;
tests/unit/test_compiled.py has each wrapper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import watchdog
from tests.helpers.harness import (
    COMPILED_STEP,
    EXIT_HANG_KILLED,
    FLOOR_S,
    assert_called_at,
    fault_time,
    stored,
)

COMPILED = str(Path(__file__).parents[1] / "jobs" / "compiled.py")
DEFAULTS = ("--on-hang", "kill")  # every threshold at its default; a hang ends the job


def cold_caches(tmp_path: Path) -> dict[str, str]:
    """A fresh node: inductor's caches and the temporary directory its builds go to, empty."""
    tmp, cache = tmp_path / "tmp", tmp_path / "inductor"
    tmp.mkdir()
    cache.mkdir()
    return {"TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(cache)}


@pytest.mark.long_job
def test_a_compiled_job_lives_through_its_compiles_and_a_later_block_is_named_at_the_floor(
        watch: Any, tmp_path: Path) -> None:
    """The first step compiles, an evaluation at step 8 and short batches from step 16 each
    compile again, with caches as cold as a fresh node's: no verdict, no kill. Rank 1 then
    blocks reading its batch at step 20: that, and only that, is named, at the floor. (Two
    ranks: each rank compiles the whole model, which made this the suite's costliest test.)"""
    run = watch("--fault-rank", "1", "--fault-step", "20", nproc=2, script=COMPILED,
                watchdog_args=DEFAULTS, env=cold_caches(tmp_path))
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["culprit_ranks"]) == ("MISSING_RANKS", [1])
    assert run.incident["waiting_ranks"] == [0]
    assert "read_batch" in run.stack_functions(1)
    assert_called_at(FLOOR_S, run.incident["detected_at"], fault_time(run.output, "data_stall"))
    assert [i["id"] for i in stored(tmp_path) if i["severity"] == "hang"] == [run.incident["id"]]


def test_a_compiled_training_step_is_counted_and_never_recompiled_for_the_hook(
        watch: Any) -> None:
    """Dynamo takes the hook for user code unless told otherwise: it guarded on the recorder's
    state and recompiled the step at every step (2 ranks, the eager backend: dynamo alone)."""
    steps, package = 20, str(Path(watchdog.__file__).parent)
    run = watch("--steps", str(steps), nproc=2, script=COMPILED_STEP, watchdog_args=DEFAULTS,
                env={"TORCH_LOGS": "recompiles"})
    assert run.returncode == 0, run.output
    recompiles = [line for line in run.output.splitlines()
                  if "__recompiles" in line and (package in line or "watchdog/hook/" in line)]
    assert recompiles == [], "\n".join(recompiles)
    for rank in (0, 1):
        assert f"rank {rank} counted {steps} steps, {steps} DDP forwards" in run.output, run.output
