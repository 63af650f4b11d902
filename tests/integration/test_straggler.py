"""Stragglers under `watchdog run` at its defaults, 4-rank DDP jobs on gloo
(tests/jobs/straggler.py). One job whose rank 3 is slow on its data for a spell, catches up,
is slow in its compute for a spell and catches up again: named each time with where it spends
the time and the seconds lost per step (within 25% of the truth), each notice ended when it
catches up, and said again when it comes back. One balanced job with jitter on every rank and
rank 0's periodic extra work, within every report interval and every few seconds: none. A rank
slow on its data where FSDP2, or an all_reduce of each gradient by hand, synchronises the
gradients, or under mp.spawn or Lightning's launcher: named the same."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import lightning_command, stored

pytestmark = pytest.mark.long_job  # each job trains for 40 s or more

JOB = str(Path(__file__).parents[1] / "jobs" / "straggler.py")
DEFAULTS: tuple[str, ...] = ()
SLOW_S = 0.4


def _notices(tmp_path: Path) -> list[dict[str, Any]]:
    return [i for i in stored(tmp_path) if i["kind"] == "STRAGGLER"]


def _lost(incident: dict[str, Any]) -> float:
    found = re.search(r"holds the job back ([0-9.]+) s per step", incident["summary"])
    assert found is not None, incident["summary"]
    return float(found.group(1))


def test_a_rank_slow_on_data_then_in_compute_is_named_there_each_time_until_it_catches_up(
        watch: Any, tmp_path: Path) -> None:
    # a notice takes 7 s of samples, 10 s held and 3 stack samples; it ends 10 s after a
    # quarter of the 20 s window caught up, and comes back once three quarters lag again
    run = watch("--slow-rank", "3", "--spells", "data:28,none:20,compute:34",
                "--seconds", "100", script=JOB, watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    assert run.incident is None  # notices, never a hang
    on_data, in_compute = _notices(tmp_path)
    for notice in (on_data, in_compute):
        assert (notice["severity"], notice["culprit_ranks"]) == ("notice", [3]), notice
        assert notice["waiting_ranks"] == [0, 1, 2]
        assert abs(_lost(notice) - SLOW_S) <= 0.25 * SLOW_S, notice["summary"]
        assert notice["ended_at"] > notice["detected_at"], notice
    assert "read_shard at straggler.py" in on_data["summary"], on_data["summary"]
    assert "crunch at straggler.py" in in_compute["summary"], in_compute["summary"]
    assert in_compute["detected_at"] > on_data["ended_at"]
    assert run.output.count("STRAGGLER in job ") == 2, run.output


def test_jitter_on_every_rank_and_rank_0s_periodic_work_are_no_straggler(
        watch: Any, tmp_path: Path) -> None:
    # steps of 0.05-0.1 s on every rank; rank 0 works 0.4 s more every 5th step (within each
    # 1 s report) and 2 s more every 100th (an evaluation)
    run = watch("--jitter", "0.05", "--rank0-work", "0.4:5,2:100", "--seconds", "40",
                script=JOB, watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    assert "finished " in run.output
    assert _notices(tmp_path) == []


def _named_once(run: Any, tmp_path: Path, where: str) -> None:
    """Rank 2, slow on its data all along, is named once, with where and its cost."""
    assert run.returncode == 0, run.output
    assert run.incident is None, run.output
    (notice,) = _notices(tmp_path)
    assert (notice["culprit_ranks"], notice["waiting_ranks"]) == ([2], [0, 1, 3]), notice
    assert abs(_lost(notice) - SLOW_S) <= 0.25 * SLOW_S, notice["summary"]
    assert where in notice["summary"], notice["summary"]


def test_a_rank_slow_on_data_is_named_where_fsdp2_synchronises_the_gradients(
        watch: Any, tmp_path: Path) -> None:
    run = watch("--slow-rank", "2", "--sync", "fsdp2", "--seconds", "40", script=JOB,
                watchdog_args=DEFAULTS)
    _named_once(run, tmp_path, "read_shard at straggler.py")


def test_a_rank_slow_on_data_is_named_under_mp_spawn_averaging_gradients_by_hand(
        watch: Any, tmp_path: Path) -> None:
    """torch.multiprocessing.spawn's ranks learn their rank from init_process_group's
    arguments (tests/jobs/straggler.py --spawn); an all_reduce of each gradient by hand is
    their only collective."""
    run = watch(job=[sys.executable, JOB, "--spawn", "4", "--sync", "by-hand", "--slow-rank",
                     "2", "--seconds", "40"], watchdog_args=DEFAULTS)
    _named_once(run, tmp_path, "read_shard at straggler.py")


def test_a_rank_slow_to_decode_is_named_under_lightnings_launcher(
        watch: Any, tmp_path: Path) -> None:
    run = watch(job=lightning_command("--fault-rank", "-1", "--slow-rank", "2", "--steps", "90",
                                      "--val-step", "1000"), watchdog_args=DEFAULTS)
    _named_once(run, tmp_path, "decode_batch at lightning_job.py")
