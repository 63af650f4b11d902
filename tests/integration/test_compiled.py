"""A DDP job whose training step is compiled (tests/jobs/compiled.py), under `watchdog run` at
the settings a user gets, 2 ranks on gloo: dynamo recompiles nothing for the hook, and the hook
counts every step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import watchdog
from tests.helpers.harness import COMPILED

STEPS = 20
PACKAGE = str(Path(watchdog.__file__).parent)


def test_a_compiled_training_step_is_counted_and_never_recompiled_for_the_hook(
        watch: Any) -> None:
    run = watch("--steps", str(STEPS), nproc=2, script=COMPILED,
                watchdog_args=("--on-hang", "kill"), env={"TORCH_LOGS": "recompiles"})
    assert run.returncode == 0, run.output
    recompiles = [line for line in run.output.splitlines()
                  if "__recompiles" in line and (PACKAGE in line or "watchdog/hook/" in line)]
    assert recompiles == [], "\n".join(recompiles)
    for rank in (0, 1):
        assert f"rank {rank} counted {STEPS} steps, {STEPS} DDP forwards" in run.output, run.output
