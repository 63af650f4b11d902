"""Fast at any step: the hook's own gaps between progress, how the coordinator's threshold uses
them after a few steps, and how start-up gaps and report delays are kept out of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.builders import T0, joined, view
from watchdog.beacon import BeaconWriter, Identity, Pace, open_beacon, read_beacon
from watchdog.coordinator.jobs import PACED_STEPS
from watchdog.coordinator.stall import ProgressTracker, StallPolicy
from watchdog.hook.pace import PaceTracker
from watchdog.hook.recorder import Recorder


def test_the_hook_counts_gaps_from_its_first_step_on() -> None:
    pace = PaceTracker()

    def observe(events: int, steps: int, now: float) -> tuple[float, Pace]:
        """The pace, and when the progress it saw last changed."""
        seen = pace.observe(events, steps, now)
        return pace.progress_at, seen

    assert observe(0, 0, 100.0) == (100.0, Pace(0.0, 0))
    assert observe(3, 0, 130.0) == (130.0, Pace(0.0, 0))  # start-up: no gap counted
    assert observe(6, 1, 131.0) == (131.0, Pace(0.0, 0))  # the first step's gap: start-up
    assert observe(9, 2, 131.5) == (131.5, Pace(0.5, 1))
    assert observe(9, 2, 135.0) == (131.5, Pace(0.5, 1))  # no change: no gap yet
    assert observe(12, 3, 135.25) == (135.25, Pace(0.5, 2))  # one long gap: not the pace


def test_a_long_gap_sets_the_pace_on_its_third_time_only() -> None:
    pace, now, events = PaceTracker(), 0.0, 0

    def gaps(*seconds: float) -> float:
        nonlocal now, events
        for gap in seconds:
            now, events = now + gap, events + 3
            pace.observe(events, 1, now)
        return pace.observe(events, 1, now).gap_p99

    pace.observe(events, 1, now)
    assert gaps(*[0.25] * 20, 30.0) == 0.25  # one evaluation among 21 gaps
    assert gaps(*[0.25] * 20, 30.0) == 0.25  # a second one
    assert gaps(*[0.25] * 20, 30.0) == 30.0  # a third: the job's rhythm now
    assert gaps(*[0.25] * 300) == 0.25  # ... until they leave the window


def test_the_recorder_publishes_its_pace_into_the_beacon(tmp_path: Path) -> None:
    identity = Identity("j", 0, 0, 2, "h", os.getpid(), 0.0)
    recorder = Recorder(BeaconWriter(str(tmp_path / "r.beacon"), identity), identity)
    recorder.publish()
    recorder.optimizer_stepped(None, None, None)
    recorder.publish()
    recorder.optimizer_stepped(None, None, None)
    recorder.publish()
    snap = read_beacon(open_beacon(recorder.writer.path))
    assert snap.steps == 2
    assert snap.pace.gaps == 1
    assert 0 < snap.pace.gap_p99 < 1.0
    assert 0 < snap.progress_at <= snap.heartbeat


def test_the_threshold_is_real_once_the_hook_measured_gaps() -> None:
    tracker = ProgressTracker(StallPolicy())
    tracker.observe(10, T0, warm=True)
    assert tracker.threshold() == 60.0  # nothing known: the warm-up
    assert tracker.threshold(hook_p99=0.2) == 10.0  # the floor
    assert tracker.threshold(hook_p99=4.0) == 20.0  # 5 x p99


def test_a_start_up_gap_never_counts_towards_the_pace() -> None:
    tracker = ProgressTracker(StallPolicy(min_samples=2))
    tracker.observe(1, T0, warm=False)
    tracker.observe(2, T0 + 40.0, warm=True)  # the first step, 40 s after the job started
    tracker.observe(3, T0 + 40.5, warm=True)
    tracker.observe(4, T0 + 41.0, warm=True)
    assert tracker.threshold() == 10.0  # not 5 x 40 s


def test_a_change_is_dated_by_the_hooks_stamp_not_by_the_report() -> None:
    tracker = ProgressTracker(StallPolicy(fixed=10.0))
    tracker.observe(1, T0)
    tracker.observe(2, T0 + 1.0, progress_at=T0 + 0.1)  # reported 0.9 s after it happened
    assert tracker.stalled_for(T0 + 10.1) == 10.0
    assert tracker.is_stalled(T0 + 10.1)
    # a late report of progress older than the last change (a report held back, a slow node)
    assert not tracker.observe(3, T0 + 12.0, progress_at=T0 + 0.05)  # no progress since
    assert tracker.stalled_for(T0 + 12.0) == pytest.approx(11.9)
    tracker.observe(4, T0 + 12.5)  # a change no hook dated: by its arrival
    assert tracker.stalled_for(T0 + 12.5) == 0.0


def test_a_job_is_paced_by_its_slowest_rank_once_each_stepped_enough() -> None:
    job = view(*(joined(r, steps=PACED_STEPS, pace=Pace(gap_p99=0.25 * (r + 1), gaps=5))
                 for r in range(4)))
    assert job.hook_p99 == 1.0
    job.update("node-1", joined(3, steps=PACED_STEPS, pace=Pace(gap_p99=0.25, gaps=5)))
    assert job.hook_p99 == 0.75
    assert view(joined(0, steps=PACED_STEPS - 1, pace=Pace(gap_p99=1.0, gaps=2))).hook_p99 is None


def test_the_latest_hook_stamp_dates_the_jobs_progress() -> None:
    job = view(*(joined(r) for r in range(4)))
    job.observe(T0)
    job.update("node-0", joined(0, events=999, progress_age=2.0), received=T0 + 3.0)
    job.observe(T0 + 3.0)
    assert job.tracker.stalled_for(T0 + 5.0) == 4.0  # since T0 + 1.0, not since T0 + 3.0


def test_late_news_of_old_progress_does_not_restart_the_stall_clock() -> None:
    """A large job's node reports its ranks' progress up to an interval late (`agent.holdback`):
    dated by the hooks, the job's last progress stays the latest of them; a change no hook
    dated (a rank without a hook, a rank starting) is dated by its arrival."""
    job = view(*(joined(r) for r in range(4)))
    job.observe(T0)
    job.update("node-0", joined(0, events=999, progress_age=0.5), received=T0 + 3.0)
    job.observe(T0 + 3.0)
    job.update("node-1", joined(1, events=999, progress_age=2.0), received=T0 + 4.0)
    seen = job.observe(T0 + 4.0)
    assert job.tracker.stalled_for(T0 + 5.0) == 2.5  # since T0 + 2.5, its latest stamp
    assert seen.resumed_after is None  # no progress since: the spell goes on
    job.update("node-2", joined(2, events=999), received=T0 + 5.0)
    job.observe(T0 + 5.0)
    assert job.tracker.stalled_for(T0 + 6.0) == 1.0
    job.update("node-4", joined(4, progress_age=9.0), received=T0 + 7.0)  # a rank starts
    job.observe(T0 + 7.0)
    assert job.tracker.stalled_for(T0 + 7.0) == 0.0
