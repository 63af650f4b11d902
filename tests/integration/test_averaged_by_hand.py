"""Silent bugs where gradients are averaged without DDP, under `watchdog run` at the settings a
user gets: 3-rank torchrun jobs (gloo) that average their gradients by hand
(tests/jobs/averaged.py), and FSDP2's HSDP on a 2x2 mesh of 4 ranks, each ending with exit 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.harness import AVERAGED, FSDP2, assert_said_once, stored, warnings

DEFAULTS = ("--on-hang", "kill")  # every threshold and check at its default
NPROC = 3  # a culprit and a majority unlike it: a fourth rank would add CPU, not a case


def test_replicas_seeded_each_their_own_way_are_out_of_sync_from_the_first_check(
        watch: Any, tmp_path: Path) -> None:
    run = watch("--mode", "desync", "--steps", "20", script=AVERAGED, watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    (incident,) = warnings(tmp_path).values()
    assert (incident["kind"], incident["culprit_ranks"]) == ("REPLICA_DESYNC", [0, 1, 2])
    assert incident["finding"]["step"] == 8
    assert incident["summary"].startswith(
        "ranks 0-2: the parameters optimizer 0 steps (gradients averaged by hand) all differ "
        "at step 8"), incident["summary"]
    assert "broadcast rank 0's parameters" in incident["finding"]["fix"]
    assert_said_once(run.output, incident)


def test_local_sgd_averaging_parameters_every_50_steps_gets_no_finding(
        watch: Any, tmp_path: Path) -> None:
    run = watch("--mode", "local_sgd", "--steps", "55", script=AVERAGED,
                watchdog_args=DEFAULTS)  # checks at 8, 16, 32; averages after steps 0 and 50
    assert run.returncode == 0, run.output
    assert "finished 55 steps" in run.output
    assert stored(tmp_path) == []


def test_replicas_seeded_alike_stay_in_sync_and_the_first_rank_whose_loss_turns_nan_is_named(
        watch: Any, tmp_path: Path) -> None:
    """Seeded alike: equal at the checks of steps 8 and 16; rank 2's loss NaN at step 30 makes
    every replica NaN from step 31 on, alike (no desync at step 32 either)."""
    run = watch("--mode", "nan", "--nan-rank", "2", "--nan-step", "30", script=AVERAGED,
                watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    assert "finished 40 steps" in run.output
    (incident,) = warnings(tmp_path).values()
    assert (incident["kind"], incident["culprit_ranks"]) == ("NONFINITE_LOSS", [2])
    assert incident["finding"]["step"] == 30
    assert incident["summary"] == ("rank 2: the loss was NaN at step 30 while ranks 0,1's "
                                   "were finite (the job's first non-finite loss)")
    assert_said_once(run.output, incident)


def test_hsdp_replicas_of_one_shard_that_differ_are_named_in_their_replicate_group(
        watch: Any, tmp_path: Path) -> None:
    """FSDP2 on a 2x2 mesh: ranks 0,2 hold replicas of shard 0, ranks 1,3 of shard 1; each rank
    seeded its own model. The 1-D job of test_silent_bugs, whose shards differ by design, gets
    no finding."""
    run = watch("--hsdp", "--steps", "12", script=FSDP2, nproc=4, watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    found = sorted((i["kind"], i["culprit_ranks"], i["finding"]["step"])
                   for i in stored(tmp_path))
    assert found == [("REPLICA_DESYNC", [0, 2], 8), ("REPLICA_DESYNC", [1, 3], 8)], found
