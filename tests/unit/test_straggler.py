"""Straggler measurement (coordinator/straggler.py) on reports a 4-rank job would send: each
rank's steps and seconds waited in collectives, once a second."""

from __future__ import annotations

import random

from tests.helpers.builders import rank
from watchdog.coordinator.straggler import HOLD_S, StragglerTracker

STEP_S = 0.1


def _feed(tracker: StragglerTracker, seconds: int, extra: dict[int, float], start: int = 0,
          jitter: float = 0.0, periodic: tuple[int, int, float] | None = None,
          seed: int = 0) -> None:
    """Every rank steps STEP_S plus its own `extra` (and jitter) per step; each waits per step
    for the slowest; a report a second. `periodic`: (rank, every, seconds) of extra work."""
    rng = random.Random(seed)
    steps = dict.fromkeys(range(4), 5 + start * 5)
    waited = dict.fromkeys(range(4), 0.0)
    for second in range(start, start + seconds):
        for step in range(5):
            own = {r: STEP_S + extra.get(r, 0.0) + rng.uniform(0, jitter) for r in range(4)}
            if periodic is not None and (second * 5 + step) % periodic[1] == 0:
                own[periodic[0]] += periodic[2]
            slowest = max(own.values())
            for r in range(4):
                waited[r] += slowest - own[r]
                steps[r] += 1
        for r in range(4):
            tracker.observe(rank(r, steps=steps[r], waited=waited[r]), float(second))


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


def test_jitter_on_every_rank_and_rank_0s_periodic_work_name_no_one() -> None:
    for seed in range(20):
        tracker = StragglerTracker()
        # steps vary 0.1-0.2 s; rank 0 evaluates 2 s every 20 steps
        _feed(tracker, 20, {}, jitter=0.1, periodic=(0, 20, 2.0), seed=seed)
        slowest = tracker.slowest(4)
        assert slowest is not None and slowest.stragglers == (), (seed, slowest)


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
