"""Bugs that never hang, found under `watchdog run` at the settings a user gets: 3-rank torchrun
jobs (gloo; the FSDP2 job 4 ranks) with a setup mistake each (watchdog/demo/train.py
--mistake) end normally, with a warning printed once and stored; a rank that runs another NCCL
than its peers is named at start (the hook's override for tests makes it differ); a healthy DDP
job and an FSDP2 job get none (ENV_MISMATCH and SHARED_DEVICE included); a warning never keeps
a later hang from being reported and acted on."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from tests.helpers.harness import (
    EXIT_HANG_KILLED,
    FSDP2,
    assert_said_once,
    stored,
    warnings,
)

DEFAULTS = ("--on-hang", "kill")  # every threshold and check at its default
STEPS = ("--steps", "40")  # checks at steps 8, 16 and 32; an epoch is 16 steps
NPROC = 3  # a culprit and a majority unlike it: a fourth rank would add CPU, not a case
EVERY_RANK = list(range(NPROC))


def test_rank_0_loading_weights_after_ddp_and_no_sampler_are_warned_and_a_hang_still_ends_it(
        watch: Any, tmp_path: Path) -> None:
    run = watch("--mistake", "load_after_ddp", "--mistake", "no_sampler", "--fault",
                "data_stall", "--fault-rank", "2", "--fault-step", "40")
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None  # the report is the hang's
    assert (run.incident["kind"], run.incident["culprit_ranks"]) == ("MISSING_RANKS", [2])
    found = warnings(tmp_path)
    assert sorted(found) == ["DUPLICATE_DATA", "REPLICA_DESYNC"]
    desync = found["REPLICA_DESYNC"]
    assert (desync["culprit_ranks"], desync["finding"]["step"]) == ([0], 8)
    assert desync["summary"].startswith("rank 0: the parameters of DDP module 0 differ from "
                                        "ranks 1,2's at step 8")
    assert "after wrapping" in desync["finding"]["cause"]
    duplicate = found["DUPLICATE_DATA"]
    assert (duplicate["culprit_ranks"], duplicate["finding"]["step"]) == (EVERY_RANK, 8)
    assert "DistributedSampler" in duplicate["finding"]["fix"]
    for incident in found.values():
        assert_said_once(run.output, incident)
        assert "(warning: the job is not hung)" in run.output


def test_ranks_that_never_wrap_their_model_sync_no_gradients(watch: Any, tmp_path: Path) -> None:
    # No set_epoch either, but that check is switched off: it says nothing.
    run = watch("--mistake", "no_ddp", "--mistake", "no_set_epoch", *STEPS,
                watchdog_args=DEFAULTS, env={"WATCHDOG_CHECKS": "-sampler_epoch_reused"})
    assert run.returncode == 0, run.output
    assert run.incident is None
    (incident,) = warnings(tmp_path).values()
    assert (incident["kind"], incident["culprit_ranks"]) == ("NO_GRAD_SYNC", EVERY_RANK)
    assert incident["finding"]["step"] == 1
    assert "DistributedDataParallel" in incident["finding"]["fix"]
    assert_said_once(run.output, incident)


def test_a_model_cast_after_ddp_and_a_sampler_never_given_its_epoch(watch: Any,
                                                                   tmp_path: Path) -> None:
    run = watch("--mistake", "cast_after_ddp", "--mistake", "no_set_epoch", *STEPS,
                watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    found = warnings(tmp_path)
    assert sorted(found) == ["DDP_MODULE_CHANGED", "REPLICA_DESYNC", "SAMPLER_EPOCH_REUSED"]
    changed = found["DDP_MODULE_CHANGED"]
    assert (changed["culprit_ranks"], changed["finding"]["step"]) == (EVERY_RANK, 8)
    assert "(dtype of weight: torch.float32 -> torch.float64)" in changed["summary"]
    # DDP no longer averages the float64 gradients: every replica drifts its own way
    assert found["REPLICA_DESYNC"]["culprit_ranks"] == EVERY_RANK
    sampler = found["SAMPLER_EPOCH_REUSED"]
    assert (sampler["culprit_ranks"], sampler["finding"]["step"]) == (EVERY_RANK, 16)
    assert "again with epoch 0" in sampler["summary"]
    assert "set_epoch" in sampler["finding"]["fix"]
    for incident in found.values():
        assert_said_once(run.output, incident)


def test_a_rank_that_runs_another_nccl_is_named_at_start_with_both_versions(
        watch: Any, tmp_path: Path) -> None:
    run = watch("--steps", "4", watchdog_args=DEFAULTS,
                env={"WATCHDOG_TEST_ENVIRONMENT": "2:nccl=2.21.5"})
    assert run.returncode == 0, run.output
    (incident,) = warnings(tmp_path).values()
    assert (incident["kind"], incident["culprit_ranks"]) == ("ENV_MISMATCH", [2])
    host = socket.gethostname().split(".", 1)[0]
    # this machine's torch has no NCCL: the others run none
    assert incident["summary"] == f"rank 2 on {host} runs NCCL 2.21.5, ranks 0,1 run none"
    assert incident["finding"]["step"] == 0
    assert "same container image" in incident["finding"]["fix"]
    assert_said_once(run.output, incident)


def test_a_healthy_ddp_job_gets_no_finding(watch: Any, tmp_path: Path) -> None:
    run = watch("--steps", "70", watchdog_args=DEFAULTS)  # checks at steps 8, 16, 32, 64
    assert run.returncode == 0, run.output
    assert "finished 70 steps" in run.output
    assert stored(tmp_path) == []


def test_an_fsdp2_job_whose_shards_differ_gets_no_finding(watch: Any, tmp_path: Path) -> None:
    run = watch(*STEPS, script=FSDP2, nproc=4, watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    assert stored(tmp_path) == []
