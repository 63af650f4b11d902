"""Whether a job is still hung a threshold after a rank's exit (coordinator.after_exit), with time
passed in: rank 2 of the 4-rank demo job exits at T0 + 5; the threshold is the floor (10 s)."""

from __future__ import annotations

import pytest

from tests.helpers.builders import JOB, T0, done, entered, exited, joining, rank, view
from watchdog.coordinator.after_exit import AfterExit, StillHung, after_exit
from watchdog.coordinator.stall import StallPolicy
from watchdog.model import RankState

EXIT = {"id": "e1", "job_id": JOB, "kind": "RANK_EXITED", "severity": "hang",
        "culprit_ranks": [2]}
WAITING = tuple(rank(r, entered(57, 3.0)) for r in (0, 1, 3))  # in all_reduce #57
LEFT = exited(rank(2, done(56, 2.0)), at=5.0, code=0, clean=True)  # a clean, early exit 0


def killed(state: RankState) -> RankState:
    """Ended by the launcher's SIGTERM."""
    return exited(state, at=5.5, code=None, clean=False)


def finished(state: RankState) -> RankState:
    return exited(state, at=6.0, code=0, clean=True)


# (what the job shows, its ranks, when it last progressed (T0 + s), now (T0 + s), the outcome)
CASES = [
    ("the peers wait, 9 s after the exit", (*WAITING, LEFT), 3.0, 14.0, "not yet"),
    ("the peers still wait 10 s after it", (*WAITING, LEFT), 3.0, 15.0, "tell"),
    ("a peer reached its wait 3 s after the exit: quiet 7 s", (*WAITING, LEFT), 8.0, 15.0,
     "not yet"),
    ("...and quiet 10 s", (*WAITING, LEFT), 8.0, 18.0, "tell"),
    ("the peers progressed a threshold past the exit", (*WAITING, LEFT), 15.5, 16.0, "never"),
    ("every rank left", (*map(finished, WAITING), LEFT), 3.0, 30.0, "never"),
    ("the launcher ended them (rank 3 not yet)",
     (*map(killed, WAITING[:2]), WAITING[2], LEFT), 3.0, 30.0, "never"),
    ("a peer that failed since: the launcher handles it",
     (exited(WAITING[0], at=5.2, code=1, clean=True), *WAITING[1:], LEFT), 3.0, 30.0, "never"),
    ("a peer that finished cleanly is no launcher's end", (WAITING[0], finished(WAITING[1]),
                                                           WAITING[2], LEFT), 3.0, 15.0, "tell"),
    ("a peer works outside any collective", (rank(0, done(57, 4.0)), *WAITING[1:], LEFT), 3.0,
     60.0, "not yet"),
    ("the peers wait in init_process_group: the floor, not the warm-up, counts",
     (joining(0), joining(1), joining(3), exited(joining(2), at=5.0, code=0, clean=True)), 3.0,
     15.0, "tell"),
]


@pytest.mark.parametrize(("ranks", "moved_at", "now", "outcome"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_still_hung_after_the_exit(ranks: tuple[RankState, ...], moved_at: float, now: float,
                                   outcome: str) -> None:
    job = view(*ranks)
    job.observe(T0 + moved_at)  # the stall clock's last change
    found = after_exit(job, EXIT, T0 + now)
    assert ("tell" if isinstance(found, StillHung) else found.value) == outcome
    if isinstance(found, StillHung):
        assert found.waited == now - 5.0 and found.incident is EXIT
        assert found.waiting == tuple(r.rank for r in ranks if r.alive)


def test_the_peers_still_waiting_are_said_with_the_rank_that_left() -> None:
    job = view(*WAITING, LEFT)
    job.observe(T0 + 3.0)
    found = after_exit(job, EXIT, T0 + 15.4)
    assert isinstance(found, StillHung)
    assert found.text() == ("ranks 0,1,3 still wait 10 s after rank 2 exited, and the launcher "
                            "did not end them")


def test_an_exit_the_view_does_not_hold_is_never_followed() -> None:
    job = view(*WAITING)
    job.observe(T0 + 3.0)
    assert after_exit(job, EXIT, T0 + 60.0) is AfterExit.NEVER


def test_the_launcher_gets_the_floor_whatever_a_short_stall_timeout_says() -> None:
    """`--stall-timeout 3`: a stall is a hang after 3 s, but ending peers whose connection to
    the rank that left just dropped takes the launcher seconds on a loaded node."""
    job = view(*WAITING, LEFT, policy=StallPolicy(fixed=3.0))
    job.observe(T0 + 3.0)
    assert after_exit(job, EXIT, T0 + 9.0) is AfterExit.NOT_YET
    assert isinstance(after_exit(job, EXIT, T0 + 15.0), StillHung)


def test_the_launcher_s_time_runs_from_the_process_s_end_not_its_sys_exit() -> None:
    """The hook times rank 2's exit at sys.exit (T0 + 5); its exit handlers took 6 s more, and
    the first report that showed the process gone came at T0 + 11: its launcher could act only
    then, and gets its floor from there."""
    job = view(*WAITING)
    job.update("node-1", rank(2, done(56, 2.0)), received=T0 + 10.0)
    job.update("node-1", LEFT, received=T0 + 11.0)
    job.update("node-1", LEFT, received=T0 + 12.0)  # a later report does not move it
    job.observe(T0 + 3.0)
    assert job.gone_at(2) == T0 + 11.0 and job.ranks[2].exited_at == T0 + 5.0
    assert after_exit(job, EXIT, T0 + 20.0) is AfterExit.NOT_YET
    found = after_exit(job, EXIT, T0 + 21.0)
    assert isinstance(found, StillHung) and found.waited == 10.0


def test_a_rank_alive_again_after_a_restart_is_no_longer_gone() -> None:
    job = view(*WAITING)
    job.update("node-1", LEFT, received=T0 + 6.0)
    assert job.gone_at(2) == T0 + 6.0
    job.update("node-1", rank(2, done(1, 30.0)), received=T0 + 30.0)
    assert job.gone_at(2) is None
    job.update("node-1", exited(rank(2, done(1, 30.0)), at=40.0, code=1, clean=True),
               received=T0 + 41.0)
    assert job.gone_at(2) == T0 + 41.0
