"""Stragglers under `watchdog run` at its defaults, 4-rank DDP jobs on gloo
(tests/jobs/straggler.py): a rank slower on its data, or its compute, by a fixed amount each
step is named with where it spends the time and the seconds lost per step (within 25% of the
truth); once it catches up the notice ends; a balanced job with jitter on every rank and rank
0's periodic extra work get none. Each job runs 30-60 s."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.helpers.harness import stored

JOB = str(Path(__file__).parents[1] / "jobs" / "straggler.py")
DEFAULTS: tuple[str, ...] = ()
SLOW_S = 0.4


def _notices(tmp_path: Path) -> list[dict[str, Any]]:
    return [i for i in stored(tmp_path) if i["kind"] == "STRAGGLER"]


def _lost(incident: dict[str, Any]) -> float:
    found = re.search(r"holds the job back ([0-9.]+) s per step", incident["summary"])
    assert found is not None, incident["summary"]
    return float(found.group(1))


def test_a_rank_slow_on_its_data_is_named_with_where_and_its_cost_and_ends_when_it_catches_up(
        watch: Any, tmp_path: Path) -> None:
    run = watch("--slow-rank", "3", "--slow-in", "data", "--slow-for", "30", "--steps", "480",
                script=JOB, watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    assert run.incident is None  # a notice, never a hang
    (notice,) = _notices(tmp_path)
    assert (notice["severity"], notice["culprit_ranks"]) == ("notice", [3]), notice
    assert notice["waiting_ranks"] == [0, 1, 2]
    assert "read_shard at straggler.py" in notice["summary"], notice["summary"]
    assert abs(_lost(notice) - SLOW_S) <= 0.25 * SLOW_S, notice["summary"]
    assert notice["ended_at"] > notice["detected_at"], notice
    assert "STRAGGLER in job " in run.output


def test_a_rank_slow_in_its_compute_is_named_there(watch: Any, tmp_path: Path) -> None:
    run = watch("--slow-rank", "1", "--slow-in", "compute", "--steps", "70", script=JOB,
                watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    (notice,) = _notices(tmp_path)
    assert notice["culprit_ranks"] == [1], notice
    assert "crunch at straggler.py" in notice["summary"], notice["summary"]
    assert abs(_lost(notice) - SLOW_S) <= 0.25 * SLOW_S, notice["summary"]


def test_jitter_on_every_rank_and_rank_0s_periodic_work_are_no_straggler(
        watch: Any, tmp_path: Path) -> None:
    # steps of 0.05-0.15 s on every rank; rank 0 works 2 s more every 20th step (logging, an
    # evaluation)
    run = watch("--jitter", "0.1", "--rank0-every", "20", "--slow-s", "2", "--steps", "300",
                script=JOB,
                watchdog_args=DEFAULTS)
    assert run.returncode == 0, run.output
    assert "finished 200 steps" in run.output
    assert _notices(tmp_path) == []
