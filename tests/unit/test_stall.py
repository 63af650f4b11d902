"""Adaptive stall detection: times are arguments, so each case plays a job's event history."""

from __future__ import annotations

import pytest

from watchdog.coordinator.stall import ProgressTracker, StallPolicy


def play(tracker: ProgressTracker, gaps: list[float], start: float = 1000.0) -> float:
    """Feed one event-count change after each gap; returns the time of the last change."""
    now, events = start, 0
    tracker.observe(events, now)
    for gap in gaps:
        now += gap
        events += 7
        tracker.observe(events, now)
    return now


def test_warm_up_grace_until_enough_gaps_are_known() -> None:
    tracker = ProgressTracker(StallPolicy())
    play(tracker, [0.5] * 7)
    assert tracker.threshold() == 60.0
    play(tracker, [0.5] * 8)
    assert tracker.threshold() == 10.0  # the floor: 5 x 0.5 s is less


def test_threshold_adapts_upward_after_slow_gaps() -> None:
    tracker = ProgressTracker(StallPolicy())
    play(tracker, [0.5] * 50)
    fast = tracker.threshold()
    play(tracker, [0.5, 4.0] * 25)  # every other step now evaluates for 4 s
    assert fast == 10.0
    assert tracker.threshold() == 20.0


def test_old_gaps_leave_the_window() -> None:
    tracker = ProgressTracker(StallPolicy(window=16))
    play(tracker, [6.0] * 16)
    assert tracker.threshold() == 30.0
    play(tracker, [1.0] * 16)
    assert tracker.threshold() == 10.0


def test_repeated_reports_without_change_are_not_progress() -> None:
    tracker = ProgressTracker(StallPolicy())
    last = play(tracker, [1.0] * 10)
    for tick in range(1, 40):
        tracker.observe(70, last + tick * 0.25)  # the same total, reported 4 times a second
    assert tracker.stalled_for(last + 12.0) == 12.0
    assert tracker.is_stalled(last + 12.0)
    assert not tracker.is_stalled(last + 9.0)


def test_fixed_timeout_overrides_adaptation_and_warm_up() -> None:
    tracker = ProgressTracker(StallPolicy(fixed=3.0))
    last = play(tracker, [0.1] * 3)
    assert tracker.threshold() == 3.0
    assert tracker.is_stalled(last + 3.0)
    assert not tracker.is_stalled(last + 2.9)


@pytest.mark.parametrize(("phase_timeout", "expected"), [(0.0, 10.0), (5.0, 10.0), (600.0, 600.0)])
def test_declared_phase_stretches_the_threshold(phase_timeout: float, expected: float) -> None:
    tracker = ProgressTracker(StallPolicy())
    last = play(tracker, [1.0] * 20)
    assert tracker.threshold(phase_timeout) == expected
    assert tracker.is_stalled(last + 120.0, phase_timeout) != (phase_timeout == 600.0)


def test_nothing_observed_is_never_stalled() -> None:
    tracker = ProgressTracker(StallPolicy(fixed=1.0))
    assert tracker.stalled_for(5000.0) == 0.0
    assert not tracker.is_stalled(5000.0)
