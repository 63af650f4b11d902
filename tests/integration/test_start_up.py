"""Before the first step, under `watchdog run` with the thresholds a user gets by default: a
rank that never reaches init_process_group, one that never reaches DDP's constructor, and a job
started with torch.multiprocessing.spawn instead of torchrun (real gloo ranks, py-spy, gRPC).

The init_process_group job spends a minute waiting for the warm-up to pass: it starts with this
module and runs beside the other test."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import (
    EXIT_HANG_KILLED,
    FLOOR_S,
    JOB_TIMEOUT_S,
    WARMUP_S,
    assert_called_at,
    fault_time,
    job_env,
    run_command,
    stop_process,
    watched_run,
)
from watchdog.cli.demo import torchrun_command

DEFAULTS = ("--on-hang", "kill")  # every threshold at its default; a hang ends the job
SPAWN_JOB = str(Path(__file__).parents[1] / "jobs" / "spawn_job.py")


@pytest.fixture(scope="module", autouse=True)
def init_stall(tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """Rank 2 prepares its data before joining, for ever; ranks 0 and 1 wait in
    init_process_group. Its output goes to a file: nobody reads a pipe while the other test
    runs."""
    tmp = tmp_path_factory.mktemp("init_stall")
    report = tmp / "incident.json"
    job = torchrun_command(3, "--fault", "init_stall", "--fault-rank", "2")
    with open(tmp / "output.log", "w") as output:
        proc = subprocess.Popen(run_command(report, job, DEFAULTS), env=job_env(tmp),
                                stdout=output, stderr=subprocess.STDOUT, text=True)
    yield proc, report
    stop_process(proc)


def test_a_spawned_job_is_diagnosed_as_a_torchrun_job_is(watch: Any) -> None:
    """torch.multiprocessing.spawn and init_process_group(rank=r, world_size=n): no RANK in any
    environment. Rank 1 blocks reading a sample at step 3."""
    job = [sys.executable, SPAWN_JOB, "--nproc", "2", "--fault", "data_stall", "--fault-rank",
           "1", "--fault-step", "3"]
    run = watch(job=job, watchdog_args=DEFAULTS)
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "MISSING_RANKS"
    assert run.incident["culprit_ranks"] == [1]
    assert run.incident["waiting_ranks"] == [0]
    assert run.incident["collective"]["op"] == "all_reduce"
    assert run.incident["summary"].startswith(
        "rank 1 (stuck in read_sample_from_storage at train.py:"), run.incident["summary"]
    assert "read_sample_from_storage" in run.stack_functions(1)
    assert "spawn_main" in run.stack_functions(1)  # a process spawn started, not torchrun


def test_a_rank_that_never_reaches_init_process_group_is_named_after_the_warm_up(
        init_stall: tuple[subprocess.Popen[str], Path]) -> None:
    """The warm-up lets a slow start-up be, and no longer."""
    proc, report = init_stall
    proc.wait(timeout=JOB_TIMEOUT_S)
    run = watched_run(proc.returncode, (report.parent / "output.log").read_text(), report)
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["severity"]) == ("MISSING_RANKS", "hang")
    assert run.incident["culprit_ranks"] == [2]
    assert run.incident["waiting_ranks"] == [0, 1]
    assert run.incident["collective"] == {"group": "0", "ranks": [0, 1, 2], "seq": 0,
                                          "op": "init_process_group"}
    assert run.incident["summary"].startswith(
        "rank 2 (stuck in prepare_dataset at train.py:"), run.incident["summary"]
    assert "never reached init_process_group; ranks 0,1 wait there since" in (
        run.incident["summary"])
    assert run.stack_functions(2)[0] == "prepare_dataset"
    assert "init_process_group" in run.stack_functions(0)
    assert [run.rank(r)["setup"] for r in (0, 1, 2)] == ["init_process_group"] * 2 + [None]
    assert_called_at(WARMUP_S, run.incident["detected_at"], fault_time(run.output, "init_stall"))


def test_a_rank_stuck_before_ddp_is_named_with_the_broadcast_its_peers_wait_in(
        watch: Any) -> None:
    """Rank 2 loads pretrained weights after init_process_group and never wraps its model: it
    idles while ranks 0 and 1 wait in DDP's constructor, in the collectives torch issues from
    C++ (its shape check first). Evidence, not the warm-up's clock, names it."""
    run = watch("--fault", "pre_ddp_stall", "--fault-rank", "2", nproc=3, watchdog_args=DEFAULTS)
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["severity"]) == ("MISSING_RANKS", "hang")
    assert run.incident["culprit_ranks"] == [2]
    assert run.incident["waiting_ranks"] == [0, 1]
    assert run.incident["collective"] == {"group": "0", "ranks": [0, 1, 2], "seq": 1,
                                          "op": "ddp_init"}
    summary = run.incident["summary"]
    assert summary.startswith("rank 2 (stuck in load_pretrained at train.py:"), summary
    assert ("never reached DDP's initial parameter broadcast (ddp_init #1 on group 0 (world)); "
            "ranks 0,1 wait there since") in summary
    assert [run.rank(r)["state"] for r in (0, 1, 2)] == ["WAITING", "WAITING", "STALLED"]
    assert "_verify_param_shape_across_processes" in run.stack_functions(0)
    assert run.stack_functions(2)[0] == "load_pretrained"
    assert_called_at(FLOOR_S, run.incident["detected_at"], fault_time(run.output,
                                                                      "pre_ddp_stall"))
