"""Which node reports the agent sends: a large job's report that says only that every rank
progressed is held back once; anything else, and every report of a small job, goes at once."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.holdback import QUIET_WORLD, Holdback
from tests.helpers.builders import T0, rank
from tests.helpers.loadgen import SimJob
from watchdog.model import CheckEvidence, ExitReason, GroupProgress, NodeReport

LARGE = SimJob(4 * QUIET_WORLD, compact=True, started_at=T0)


def sent(holdback: Holdback, reports: list[NodeReport], delivered: bool = True) -> list[bool]:
    return [holdback.worth_sending(report, delivered) for report in reports]


def test_a_large_jobs_progress_alone_is_held_back_once_in_two() -> None:
    reports = [LARGE.report(3, T0 + 10 + s) for s in range(6)]
    assert sent(Holdback(), reports) == [True, False] * 3


def test_a_stall_is_sent_at_once_and_then_every_interval() -> None:
    hung = dataclasses.replace(LARGE, hung_at=T0 + 11.2)
    reports = [hung.report(node, T0 + 10 + s) for node in (LARGE.culprit // 8, 0)
               for s in range(5)]
    # progressing at 10 and 11 (the second held), then nothing moves: every report goes
    assert sent(Holdback(), reports[:5]) == [True, False, True, True, True]
    assert sent(Holdback(), reports[5:]) == [True, False, True, True, True]  # the waiting ranks too


def test_a_report_whose_last_did_not_leave_the_agent_is_sent() -> None:
    reports = [LARGE.report(3, T0 + 10 + s) for s in range(4)]
    assert sent(Holdback(), reports, delivered=False) == [True] * 4


def progressing(world: int, at: int, **changes: Any) -> NodeReport:
    """Two ranks of a job of `world` ranks, at their `at`-th interval of progress."""
    fields = {"world_size": world, "events": 1000 + 3 * at, "steps": 100 + at}
    return NodeReport("node-a", T0 + at, tuple(
        rank(r, GroupProgress("0", (), 100 + at, "all_reduce", 99 + at, T0 + at),
             **(fields | changes if r == 1 else fields)) for r in (0, 1)))


def test_every_report_of_a_small_job_is_sent() -> None:
    reports = [progressing(QUIET_WORLD - 1, at) for at in range(4)]
    assert sent(Holdback(), reports) == [True] * 4
    assert sent(Holdback(), [progressing(QUIET_WORLD, at) for at in range(4)]) == [True, False] * 2


NEWS: dict[str, dict[str, Any]] = {
    "a phase began": {"phase": "evaluate", "phase_timeout": 600.0},
    "a set-up call": {"setup": "new_group"},
    "the rank exited": {"exited_at": T0 + 1, "exit_code": 1, "proc_state": ""},
    "it raised": {"exit_reason": ExitReason(exception="RuntimeError", message="boom")},
    "a check's finding": {"evidence": CheckEvidence(checks=("sampler",), sampler_reuses=1)},
    "a group joined": {"groups": (GroupProgress("0", (), 101, "all_reduce", 100, T0 + 1),
                                  GroupProgress("1", (0, 1), 1, "broadcast", 0, T0 + 1))},
    "another process": {"pid": 777},
    "a restart": {"attempt": 1},
    "no progress": {"events": 1000, "steps": 100},
    "no hook": {"hooked": False},
}


@pytest.mark.parametrize("change", NEWS.values(), ids=NEWS.keys())
def test_anything_besides_progress_is_sent_at_once(change: dict[str, Any]) -> None:
    holdback = Holdback()
    assert holdback.worth_sending(progressing(QUIET_WORLD, 0), True)
    assert holdback.worth_sending(progressing(QUIET_WORLD, 1, **change), True)


def test_a_rank_come_or_gone_is_sent() -> None:
    holdback = Holdback()
    two = progressing(QUIET_WORLD, 0)
    assert holdback.worth_sending(two, True)
    assert holdback.worth_sending(dataclasses.replace(two, ranks=two.ranks[:1]), True)
    assert holdback.worth_sending(two, True)


def test_its_activity_and_process_state_alone_are_no_news() -> None:
    holdback = Holdback()
    assert holdback.worth_sending(progressing(QUIET_WORLD, 0), True)
    assert not holdback.worth_sending(progressing(QUIET_WORLD, 1, proc_state="R",
                                              heartbeat_age=0.9, progress_age=0.3), True)
