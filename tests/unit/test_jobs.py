"""The coordinator's JobView: its running totals must match the ranks' latest states, whatever
sequence of reports led there (states shaped like those of the 4-rank demo job)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.builders import POLICY, T0, done, joined, judgement, rank, view
from watchdog.coordinator.jobs import WARM_EVENTS, JobView
from watchdog.model import RankState


def left(state: RankState, code: int = 0) -> RankState:
    return dataclasses.replace(state, exited_at=T0 + 5, exit_code=code, clean_exit=True,
                               proc_state="")


def test_the_stall_clock_runs_from_the_first_report_and_each_rank_starting_is_progress(
        ) -> None:
    """Rank 3 never reaches init_process_group: no rank joins a group, and still the job stalls
    once the warm-up is over. A rank that starts later restarts the clock."""
    job = view(*(rank(n, steps=0) for n in range(3)))
    job.observe(T0)
    job.update("node-1", rank(3, steps=0))
    job.observe(T0 + 20)
    assert job.tracker.stalled_for(T0 + 20) == 0.0
    assert not job.stalled(T0 + 20 + POLICY.warmup - 1)
    assert job.stalled(T0 + 20 + POLICY.warmup)


def test_a_second_live_process_claiming_a_rank_is_noted_not_followed() -> None:
    first = rank(1, pid=100)
    job = view(joined(0), first)
    job.update("node-0", rank(1, pid=200))
    job.update("node-1", rank(1, pid=100, host="node-b"))  # the same pid in another host
    assert job.ranks[1].pid == 100
    assert job.snapshot(T0).duplicates == {1: (("node-a", 100), ("node-a", 200),
                                               ("node-b", 100))}
    job.update("node-0", left(first))
    job.update("node-0", rank(1, pid=200))
    assert job.ranks[1].pid == 200 and job.snapshot(T0).duplicates == {}


def test_warm_up_grace_lasts_until_every_hooked_rank_stepped() -> None:
    cold = dict(steps=0, events=WARM_EVENTS - 1)
    job = view(*(joined(n) for n in range(3)), joined(3, **cold))
    assert job.warming
    job.update("node-1", joined(3, steps=1))
    assert not job.warming
    assert not view(*(joined(n, hooked=False, **cold) for n in range(4))).warming


def test_declared_phase_grace_ends_with_the_phase_or_the_rank() -> None:
    saving = joined(1, phase="checkpoint", phase_age=30.0, phase_timeout=600.0)
    job = view(joined(0), saving, joined(2), joined(3))
    assert job.phase_grace() == 600.0
    job.update("node-0", dataclasses.replace(saving, phase_age=601.0))
    assert job.phase_grace() == 0.0
    job.update("node-0", saving)
    job.update("node-0", left(saving))
    assert job.phase_grace() == 0.0


def test_exits_are_counted_and_the_last_exit_ends_the_job() -> None:
    states = [joined(n) for n in range(4)]
    job = view(*states)
    assert (job.exits, job.live, job.everyone_left) == (0, 4, False)
    job.update("node-1", left(states[3]))
    assert (job.exits, job.live, job.everyone_left) == (1, 3, False)
    for state in states[:3]:
        job.update("node-0", left(state))
    assert job.everyone_left and judgement().job_state(job, T0) == "FINISHED"


def test_events_total_counts_each_rank_once() -> None:
    job = view(*(joined(n, events=10) for n in range(4)))
    job.update("node-0", joined(0, events=25))
    assert job.events_total() == 10 * 3 + 25 + 4  # each rank's start counts too


def totals(job: JobView, now: float) -> tuple[object, ...]:
    return (job.events_total(), job.world_size, job.warming, job.phase_grace(), job.exits,
            job.everyone_left, job.partly_waiting, job.all_waiting, job.stacks_only,
            job.stalled(now), judgement().job_state(job, now))


STATES = st.builds(
    lambda number, hooked, steps, events, grouped, phase_age, gone: (
        lambda state: left(state, code=1) if gone else state)(
        rank(number, *([done(56, 2.0)] if grouped else []), hooked=hooked, steps=steps,
             events=events, phase="save" if phase_age is not None else "",
             phase_age=phase_age or 0.0, phase_timeout=300.0 if phase_age is not None else 0.0)),
    st.integers(0, 3), st.booleans(), st.integers(0, 2), st.integers(0, 2 * WARM_EVENTS),
    st.booleans(), st.none() | st.floats(0, 600), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(STATES, max_size=24))
def test_totals_depend_only_on_each_ranks_latest_state(history: list[RankState]) -> None:
    """Running totals after any history equal those of a view fed only the latest states."""
    latest = {state.rank: state for state in history}
    assert totals(view(*history), T0) == totals(view(*latest.values()), T0)
