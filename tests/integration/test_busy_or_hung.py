"""Busy or hung, under `watchdog run` with the thresholds a user gets by default: long legitimate
phases are never killed, a rank that works while its peers wait is a notice until the busy
timeout, and a rank that stops is named once the floor passes, at any step (real torchrun,
gloo, py-spy)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import (
    EXIT_HANG_KILLED,
    FLOOR_S,
    FSDP2,
    assert_called_at,
    fault_time,
    stored,
)

CHECKPOINT_S = 30.0  # the demo job's --fault-seconds
DEFAULTS = ("--on-hang", "kill")  # every threshold at its default; a hang ends the job
NPROC = 3  # a culprit and a majority waiting on it: a fourth rank would add CPU, not a case


@pytest.mark.long_job
def test_rank_0_writing_a_checkpoint_for_30_s_is_busy_not_hung(watch: Any,
                                                               tmp_path: Path) -> None:
    """A phase that passes the threshold: the job is looked at, rank 0 is busy, not hung."""
    run = watch("--checkpoint-at", "40", "--fault-rank", "0", "--steps", "50",
                watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    assert "finished 50 steps" in run.output
    assert run.incident is None  # the report is for hangs; a notice is printed and stored
    (notice,) = stored(tmp_path)
    assert (notice["kind"], notice["severity"]) == ("RANK_BUSY", "notice")
    assert notice["culprit_ranks"] == [0]
    assert notice["waiting_ranks"] == [1, 2]
    assert notice["summary"].startswith("rank 0 busy in write_checkpoint at train.py:")
    assert re.search(r"writing [\d.]+ [MG]B/s", notice["summary"]), notice["summary"]
    assert "ranks 1,2 wait in barrier #" in notice["summary"]
    assert notice["collective"]["op"] == "barrier"
    assert "RANK_BUSY in job" in run.output
    assert "(notice: the job is not hung)" in run.output
    assert re.search(r"^watchdog: watching job train-\S+: 3 of 3 ranks report; hung after ",
                     run.output, re.MULTILINE), run.output
    # The rank moved on once its checkpoint was written: the stored notice says when, and run
    # said for how long it was busy: from before the notice, and not before the checkpoint began.
    began = fault_time(run.output, "checkpoint")
    assert notice["ended_at"] > notice["detected_at"]
    assert notice["ended_at"] - began >= CHECKPOINT_S
    moved = re.search(rf"^watchdog: rank 0 moved on after (\d+) s \(RANK_BUSY notice "
                      rf"{notice['id']}\)$", run.output, re.MULTILINE)
    assert moved is not None, run.output
    busy_for, ended = int(moved.group(1)), notice["ended_at"]
    assert ended - notice["detected_at"] - 1 <= busy_for <= ended - began + 1


@pytest.mark.parametrize("step", [6, 60])
def test_rank_blocked_in_data_loading_is_named_once_the_floor_passes(
        watch: Any, step: int) -> None:
    run = watch("--fault", "data_stall", "--fault-rank", "1", "--fault-step", str(step),
                watchdog_args=DEFAULTS)
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["severity"]) == ("MISSING_RANKS", "hang")
    assert run.incident["culprit_ranks"] == [1]
    assert run.incident["waiting_ranks"] == [0, 2]
    assert run.incident["collective"]["op"] == "all_reduce"
    assert run.rank(1)["state"] == "STALLED"
    assert_called_at(FLOOR_S, run.incident["detected_at"], fault_time(run.output, "data_stall"))


def test_fsdp2_rank_blocked_in_data_loading_never_reached_its_all_gather(watch: Any) -> None:
    run = watch("--fault-rank", "1", "--fault-step", "6", script=FSDP2, watchdog_args=DEFAULTS)
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "MISSING_RANKS"
    assert run.incident["culprit_ranks"] == [1]
    assert run.incident["waiting_ranks"] == [0, 2]
    collective = run.incident["collective"]
    assert (collective["group"], collective["op"]) == ("0", "all_gather_single")
    assert "read_sample_from_storage" in run.stack_functions(1)
    tops = [group["top"] for group in run.incident["stack_groups"]]
    hook_wrappers = ("(c10d.py:", "(works.py:", "patch_work_wait")  # watchdog/hook/patches/
    assert not any(top.startswith("wait ") or any(w in top for w in hook_wrappers)
                   for top in tops), tops
    assert_called_at(FLOOR_S, run.incident["detected_at"], fault_time(run.output, "data_stall"))


def test_a_livelock_is_busy_at_once_and_hung_after_the_busy_timeout(watch: Any,
                                                                    tmp_path: Path) -> None:
    busy_timeout = 20.0
    run = watch("--fault", "livelock", "--fault-rank", "2", "--fault-step", "30",
                watchdog_args=(*DEFAULTS, "--busy-timeout", str(busy_timeout)))
    assert run.returncode == EXIT_HANG_KILLED, run.output
    began = fault_time(run.output, "livelock")
    notice, hang = stored(tmp_path)
    assert (notice["kind"], notice["severity"], notice["culprit_ranks"]) == (
        "RANK_BUSY", "notice", [2])
    assert notice["summary"].startswith("rank 2 busy in spin_until_ready at train.py:")
    assert "of a core" in notice["summary"]
    assert_called_at(FLOOR_S, notice["detected_at"], began)
    assert run.incident == hang
    assert (hang["kind"], hang["severity"], hang["culprit_ranks"]) == (
        "MISSING_RANKS", "hang", [2])
    assert "past the busy timeout" in hang["summary"]
    assert hang["detected_at"] - began >= busy_timeout
