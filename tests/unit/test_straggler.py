"""Straggler measurement (coordinator/straggler.py) on reports a 4-rank job would send: each
rank's steps and seconds waited in collectives, once a second."""

from __future__ import annotations

import random
from typing import Any

from tests.helpers.builders import exited, rank
from watchdog.coordinator.straggler import HOLD_S, Slowest, StragglerTracker
from watchdog.coordinator.straggler_notice import summary
from watchdog.report.job_pages import job_page
from watchdog.report.terminal import render_status

STEP_S = 0.1


def _feed(tracker: StragglerTracker, seconds: int, extra: dict[int, float], start: int = 0,
          jitter: float = 0.0, periodic: tuple[int, int, float] | None = None,
          seed: int = 0) -> None:
    """Every rank steps STEP_S plus its own `extra` (and jitter) per step; each waits per step
    for the slowest; a report a second. `periodic`: (rank, every, seconds) of extra work."""
    rng = random.Random(seed)
    steps = dict.fromkeys(range(4), 5 + start * 5)
    waited = dict.fromkeys(range(4), 0.0)
    squared = dict.fromkeys(range(4), 0.0)
    for second in range(start, start + seconds):
        for step in range(5):
            own = {r: STEP_S + extra.get(r, 0.0) + rng.uniform(0, jitter) for r in range(4)}
            if periodic is not None and (second * 5 + step) % periodic[1] == 0:
                own[periodic[0]] += periodic[2]
            slowest = max(own.values())
            for r in range(4):
                waited[r] += slowest - own[r]
                squared[r] += (slowest - own[r]) ** 2
                steps[r] += 1
        for r in range(4):
            tracker.observe(rank(r, steps=steps[r], waited=waited[r], waited_sq=squared[r]),
                            float(second))


def test_a_rank_slower_by_a_fixed_amount_is_named_with_what_it_costs() -> None:
    tracker = StragglerTracker()
    _feed(tracker, 20, {3: 0.4})
    slowest = tracker.slowest(4)
    assert slowest is not None
    assert (slowest.rank, slowest.stragglers) == (3, (3,))
    assert abs(slowest.lost - 0.4) < 0.01
    assert tracker.evaluate(slowest, 20.0) is None  # not for HOLD_S yet
    assert tracker.evaluate(slowest, 20.0 + HOLD_S) == (3,)
    assert tracker.evaluate(slowest, 40.0) is None  # said once
    # a rank that exits (the job ends) leaves no window to compare: the gauge goes with it
    tracker.observe(exited(rank(0, steps=200), 1.0, 0, True), 21.0)
    assert tracker.slowest(4) is None


def test_jitter_on_every_rank_and_rank_0s_periodic_work_name_no_one() -> None:
    for seed in range(20):
        tracker = StragglerTracker()
        # steps vary 0.1-0.2 s; rank 0 evaluates 2 s every 20 steps
        _feed(tracker, 20, {}, jitter=0.1, periodic=(0, 20, 2.0), seed=seed)
        slowest = tracker.slowest(4)
        assert slowest is not None and slowest.stragglers == (), (seed, slowest)


def test_rank_0s_work_every_few_steps_within_each_report_is_a_phase_not_a_straggler() -> None:
    # 0.4 s every 5 steps of 0.1 s: one in every report interval, so each interval reads as
    # rank 0 costing the others 0.08 s a step; the waits per step say it is one step in five
    for seed in range(5):
        tracker = StragglerTracker()
        _feed(tracker, 20, {}, jitter=0.02, periodic=(0, 5, 0.4), seed=seed)
        slowest = tracker.slowest(4)
        assert slowest is not None and slowest.rank == 0 and slowest.lost > 0.05, slowest
        assert slowest.stragglers == (), (seed, slowest)
    # the same cost spread over every step is a straggler
    tracker = StragglerTracker()
    _feed(tracker, 20, {0: 0.08}, jitter=0.02)
    assert tracker.slowest(4).stragglers == (0,)  # type: ignore[union-attr]


def test_the_first_steps_and_a_job_with_ranks_missing_are_not_compared() -> None:
    tracker = StragglerTracker()
    _feed(tracker, 5, {3: 0.4})
    assert tracker.slowest(4) is None  # too few intervals yet
    _feed(tracker, 20, {3: 0.4}, start=5)
    assert tracker.slowest(5) is None  # a rank of the world never compared


def test_a_straggler_that_catches_up_ends_its_notice() -> None:
    tracker = StragglerTracker()
    _feed(tracker, 20, {2: 0.3})
    tracker.evaluate(tracker.slowest(4), 20.0)
    assert tracker.evaluate(tracker.slowest(4), 20.0 + HOLD_S) == (2,)
    _feed(tracker, 20, {}, start=20)
    assert tracker.slowest(4) is not None
    assert tracker.evaluate(tracker.slowest(4), 41.0) is None
    assert tracker.evaluate(tracker.slowest(4), 41.0 + HOLD_S) == ()
    assert tracker.called == ()


def _status_job(ended: bool) -> Any:
    notice: dict[str, Any] = {
        "id": "abc123", "kind": "STRAGGLER", "severity": "notice", "job_id": "j",
        "summary": "rank 3 (host node-b) holds the job back 0.41 s per step (82% of each step), "
                   "in read_shard at data.py:16",
        "finding": {"cause": "...", "fix": "Look at the slow rank"}, "culprit_ranks": [3]}
    if ended:
        notice["ended_at"] = 1.0
    return {"job_id": "j", "state": "RUNNING", "world_size": 4, "nodes": ["node-b"], "ranks": [],
            "verdict": None, "findings": [notice], "flagged": [],
            "slowest": {"rank": 3, "host": "node-b", "lost_per_step": 0.41, "share": 0.82,
                        "straggler": not ended}}


def test_status_and_the_job_page_show_the_notice_and_the_slowest_rank() -> None:
    text = render_status({"jobs": [_status_job(ended=False)]})
    assert "STRAGGLER (notice): rank 3 (host node-b) holds the job back 0.41 s" in text, text
    assert ("slowest: rank 3 (host node-b), the others wait 0.41 s per step for it (82% of a "
            "step): a straggler") in text, text
    assert "STRAGGLER (notice, ended)" in render_status({"jobs": [_status_job(ended=True)]})
    page = job_page(_status_job(ended=True))
    assert "<h2>Findings and notices</h2>" in page
    assert "STRAGGLER</span> notice · ended" in page and "holds the job back 0.41 s" in page
    assert 'href="/incidents/abc123"' in page, page
    assert "below the straggler" in page


def test_the_summary_names_the_straggler_its_host_its_place_and_the_waiters_once() -> None:
    ranks = {r: rank(r, host="node-b" if r == 3 else "node-a") for r in range(4)}
    text = summary(ranks, Slowest(3, 0.41, 0.5, (3,)), [3],
                   ("in read_shard at data.py:16", "DDP's all-reduce"))
    assert text == ("rank 3 (host node-b) holds the job back 0.41 s per step (82% of each "
                    "step), in read_shard at data.py:16; ranks 0-2 wait in DDP's all-reduce")
