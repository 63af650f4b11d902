"""The coordinator's clock-driven decisions, with time passed in: node silence, the job limit,
when a stalled job is diagnosed, and the twin check that keeps a restarted coordinator from
reporting one hang twice."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.builders import JOB, T0, done, entered, exited, raised, rank, told
from watchdog import metrics
from watchdog.coordinator import Coordinator, StallPolicy
from watchdog.coordinator import settle as settling
from watchdog.coordinator.after_exit import StillHung
from watchdog.coordinator.garbage_collection import FULL_EVERY, sparing_full_collections
from watchdog.coordinator.node_silence import NODE_TIMEOUT_S
from watchdog.coordinator.service import MAX_JOBS, ROOM_MADE
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.model import EVERY_JOB, NodeReport, RankState


def coordinator(tmp_path: Path, **policy: float) -> Coordinator:
    return Coordinator(SqliteStore(str(tmp_path / "incidents.db")), StallPolicy(**policy))


def report(node: str, *states: RankState) -> NodeReport:
    return NodeReport(node, T0, states)


def test_a_node_is_silent_after_three_missed_reports_and_unreachable_later(
        tmp_path: Path) -> None:
    hub = coordinator(tmp_path)
    for second in range(5):  # one report a second
        hub.ingest(report("node-a", rank(0)), T0 + second)
    last = T0 + 4
    assert hub.nodes.silence("node-a", last + 2.9) == (False, False)
    assert hub.nodes.silence("node-a", last + 3.1) == (True, False)
    assert hub.nodes.silence("node-a", last + NODE_TIMEOUT_S + 0.1) == (True, True)
    hub.ingest(report("node-a", rank(0)), last + NODE_TIMEOUT_S + 1)
    assert hub.nodes.silence("node-a", last + NODE_TIMEOUT_S + 1.5) == (False, False)


def test_jobs_no_one_reports_are_forgotten_and_new_ones_always_followed(
        tmp_path: Path) -> None:
    hub = Coordinator(SqliteStore(str(tmp_path / "incidents.db")), StallPolicy(),
                      job_retention=60.0)
    hub.ingest(report("node-a", rank(0, job_id="old")), T0)
    for n in range(10):
        hub.ingest(report("node-a", rank(0, job_id=f"job-{n}")), T0 + 50)
    hub.forget_old(T0 + 61)
    assert sorted(hub.jobs) == [f"job-{n}" for n in range(10)]
    hub.ingest(report("node-b", rank(0, job_id="old")), T0 + 200)  # a job seen again is new
    hub.forget_old(T0 + 200)
    assert sorted(hub.jobs) == ["old"]
    assert hub.nodes.silence("node-a", T0 + 200) == (False, False)  # forgotten, not silent


def test_at_the_job_limit_the_jobs_reported_least_recently_make_room(tmp_path: Path) -> None:
    hub = coordinator(tmp_path)
    for n in range(MAX_JOBS):
        hub.ingest(report("node-a", rank(0, job_id=f"job-{n}")), T0 + n)
    hub.ingest(report("node-a", rank(0, job_id="job-0")), T0 + MAX_JOBS)
    hub.ingest(report("node-a", rank(0, job_id="newest")), T0 + MAX_JOBS + 1)
    assert len(hub.jobs) == MAX_JOBS - ROOM_MADE + 1
    assert "newest" in hub.jobs and "job-0" in hub.jobs
    assert [n for n in range(MAX_JOBS) if f"job-{n}" not in hub.jobs] == list(
        range(1, ROOM_MADE + 1))


def test_at_the_job_limit_the_user_with_the_most_jobs_loses_theirs_not_anothers(
        tmp_path: Path) -> None:
    """Before shares, one user's fresh job ids pushed out root's job, reported least recently."""
    hub = coordinator(tmp_path)
    hub.ingest(report("node-a", rank(0, job_id="roots", uid=0)), T0)
    for n in range(MAX_JOBS):
        hub.ingest(report("node-a", rank(0, job_id=f"spam-{n}", uid=65534)), T0 + 1 + n)
    assert "roots" in hub.jobs
    assert [n for n in range(MAX_JOBS) if f"spam-{n}" not in hub.jobs] == list(range(ROOM_MADE))


def test_a_stalled_job_is_diagnosed_once_its_threshold_passed(tmp_path: Path) -> None:
    hub = coordinator(tmp_path, fixed=5.0)
    hub.listeners.append(lambda incident: None)
    stuck = [rank(1, done(56, 2.0)), *(rank(r, entered(57, 3.0)) for r in (0, 2, 3))]

    async def judge(at: float) -> int:
        hub.ingest(report("node-a", *stuck), at)
        tasks = hub.evaluate_all(at)
        await asyncio.gather(*tasks)
        return len(tasks)

    async def scenario() -> list[int]:
        # Progress until T0, then nothing: judged only past the fixed 5 s (and the warm-up).
        hub.ingest(report("node-a", *(dataclasses.replace(s, events=0) for s in stuck)), T0 - 1)
        hub.evaluate_all(T0 - 1)
        return [await judge(T0), await judge(T0 + 4.9), await judge(T0 + 5.1)]

    assert asyncio.run(scenario()) == [0, 0, 1]
    incident = hub.judgements[stuck[0].job_id].incident
    assert incident is not None and incident["culprit_ranks"] == [1]


def test_status_says_which_attempt_of_the_job_each_one_is(tmp_path: Path) -> None:
    hub = coordinator(tmp_path)
    restarted = f"{JOB}/attempt1"
    hub.ingest(report("node-a", rank(0), rank(0, job_id=restarted, attempt=1)), T0)
    jobs = json.loads(hub.status_json(EVERY_JOB))["jobs"]
    assert {job["job_id"]: job["attempt"] for job in jobs} == {JOB: 0, restarted: 1}


def test_a_restarted_coordinator_finds_the_hang_it_already_stored(tmp_path: Path) -> None:
    hub = coordinator(tmp_path)
    stored = {"id": "a1", "job_id": "j", "detected_at": T0, "kind": "MISSING_RANKS",
              "culprit_ranks": [1], "collective": {"group": "0", "seq": 57}}
    hub.store.add(stored)
    again = {**stored, "id": "b2", "detected_at": T0 + 30}
    assert asyncio.run(hub.stored_twin(again)) == stored
    assert asyncio.run(hub.stored_twin({**again, "culprit_ranks": [2]})) is None
    assert asyncio.run(hub.stored_twin({**again, "job_id": "other"})) is None


def test_a_notice_ends_when_the_job_moves_on_stored_in_place_and_told(tmp_path: Path) -> None:
    hub = coordinator(tmp_path, fixed=60.0)  # no diagnosis meanwhile: the notice is said here
    ended: list[tuple[dict[str, Any], float]] = []
    hub.ended_listeners.append(lambda incident, lasted: ended.append((incident, lasted)))
    busy = [rank(0, done(56, 2.0)), *(rank(r, entered(57, 3.0)) for r in (1, 2, 3))]
    notice = {"id": "n1", "job_id": JOB, "detected_at": T0 + 12.0, "kind": "RANK_BUSY",
              "severity": "notice", "culprit_ranks": [0]}
    hub.store.add(notice)

    async def scenario() -> None:
        hub.ingest(report("node-a", *busy), T0)
        hub.evaluate_all(T0)
        judged = told(hub.judgements[JOB], hub.jobs[JOB], notice)  # said at T0 + 12
        await asyncio.gather(*hub.evaluate_all(T0 + 20.0))
        assert ended == [] and judged.open  # still busy
        moved = [dataclasses.replace(s, events=s.events + 1) for s in busy]
        hub.ingest(report("node-a", *moved), T0 + 30.0)
        await asyncio.gather(*hub.evaluate_all(T0 + 30.0))
        await hub.saver.close()

    asyncio.run(scenario())
    ((said, lasted),) = ended
    assert said == {**notice, "ended_at": T0 + 30.0} and lasted == 30.0
    assert hub.judgements[JOB].incident == said and not hub.judgements[JOB].open
    (stored,) = SqliteStore(str(tmp_path / "incidents.db")).listed()
    assert json.loads(stored.text) == said  # the same row, its text replaced


def test_a_hang_the_job_contradicts_is_marked_resumed_stored_counted_and_told(
        tmp_path: Path) -> None:
    """Progress after a hang verdict nobody acted on: the watchdog was wrong, and says so
    (`resumed_at`, not a notice's `ended_at`), in place in the store, on its counter and to
    the listeners of ends (`watchdog run` prints it)."""
    hub = coordinator(tmp_path, fixed=5.0)
    ended: list[tuple[dict[str, Any], float]] = []
    hub.ended_listeners.append(lambda incident, lasted: ended.append((incident, lasted)))
    stuck = [rank(r, entered(57, 3.0)) for r in range(4)]
    hang = {"id": "h1", "job_id": JOB, "detected_at": T0 + 6.0, "kind": "ALL_IN_COLLECTIVE",
            "severity": "hang", "culprit_ranks": []}
    hub.store.add(hang)
    before = metrics.VERDICTS_RESUMED._value.get()

    async def scenario() -> None:
        hub.ingest(report("node-a", *stuck), T0)
        hub.evaluate_all(T0)
        told(hub.judgements[JOB], hub.jobs[JOB], hang)
        moved = [dataclasses.replace(s, events=s.events + 1) for s in stuck]
        hub.ingest(report("node-a", *moved), T0 + 9)
        await asyncio.gather(*hub.evaluate_all(T0 + 9.0))
        await hub.saver.close()

    asyncio.run(scenario())
    ((said, lasted),) = ended
    assert said == {**hang, "resumed_at": T0 + 9.0} and lasted == 9.0
    (stored,) = SqliteStore(str(tmp_path / "incidents.db")).listed()
    assert json.loads(stored.text) == said
    assert metrics.VERDICTS_RESUMED._value.get() == before + 1
    judged = hub.judgements[JOB]
    assert judged.incident == said and not judged.hung and not judged.hung_before


def test_a_hang_let_go_or_an_exit_is_never_marked_resumed(tmp_path: Path) -> None:
    """An end asked for (`--on-hang kill`, Ctrl-C) moves the count as the ranks shut down; an
    exit is no claim that progress can contradict."""
    for kind, let_go in (("MISSING_RANKS", True), ("RANK_EXITED", False)):
        hub = coordinator(tmp_path / kind, fixed=5.0)
        ended: list[tuple[dict[str, Any], float]] = []
        hub.ended_listeners.append(lambda incident, lasted, e=ended: e.append((incident, lasted)))
        stuck = [rank(r, entered(57, 3.0)) for r in range(4)]

        async def scenario(hub: Coordinator = hub, stuck: list[RankState] = stuck,
                           kind: str = kind, let_go: bool = let_go) -> None:
            hub.ingest(report("node-a", *stuck), T0)
            hub.evaluate_all(T0)
            told(hub.judgements[JOB], hub.jobs[JOB],
                 {"id": "h1", "job_id": JOB, "detected_at": T0 + 6.0, "kind": kind,
                  "severity": "hang", "culprit_ranks": [1]})
            if let_go:
                hub.let_go(JOB)
            moved = [dataclasses.replace(s, events=s.events + 1) for s in stuck]
            hub.ingest(report("node-a", *moved), T0 + 9)
            await asyncio.gather(*hub.evaluate_all(T0 + 9.0))

        asyncio.run(scenario())
        assert ended == [] and "resumed_at" not in (hub.judgements[JOB].incident or {}), kind


def test_a_job_let_go_after_its_hang_is_judged_no_more(tmp_path: Path) -> None:
    """`watchdog run --on-hang kill` ends the job: the rank its SIGKILL ends first is no
    RANK_EXITED, even once its peers' shutdown moved the job's count."""
    hub = coordinator(tmp_path, fixed=5.0)
    heard: list[dict[str, Any]] = []
    hub.listeners.append(heard.append)
    stuck = [rank(1, done(56, 2.0)), *(rank(r, entered(57, 3.0)) for r in (0, 2, 3))]

    async def scenario() -> None:
        hub.ingest(report("node-a", *(dataclasses.replace(s, events=0) for s in stuck)), T0 - 1)
        hub.evaluate_all(T0 - 1)
        told(hub.judgements[JOB], hub.jobs[JOB],
             {"id": "h1", "detected_at": T0 + 6.0, "kind": "MISSING_RANKS", "severity": "hang",
              "culprit_ranks": [1]})
        hub.let_go(JOB)
        # SIGTERM: the ranks shut down (Lightning handles it) and move the count; 5 s later
        # the SIGKILL ends rank 1, the first to exit.
        ending = [dataclasses.replace(s, events=s.events + 5) for s in stuck]
        hub.ingest(report("node-a", *ending), T0 + 7.0)
        await asyncio.gather(*hub.evaluate_all(T0 + 7.0))
        killed = exited(ending[0], at=12.0, code=-9, clean=False)
        hub.ingest(report("node-a", killed, *ending[1:]), T0 + 12.0)
        await asyncio.gather(*hub.evaluate_all(T0 + 12.0))
        await hub.settled()

    asyncio.run(scenario())
    assert heard == []


def test_a_job_still_hung_after_an_exit_is_told_once_and_never_when_let_go(
        tmp_path: Path) -> None:
    """Rank 2 exits 0 at T0 + 5 while its peers wait: told once, a threshold (10 s) after the
    exit; a job the watchdog itself ends is told nothing."""
    hub = coordinator(tmp_path)
    still: list[StillHung] = []
    hub.still_hung_listeners.append(still.append)
    ranks = [*(rank(r, entered(57, 3.0)) for r in (0, 1, 3)),
             exited(rank(2, done(56, 2.0)), at=5.0, code=0, clean=True)]
    exit_incident = {"id": "e1", "job_id": JOB, "kind": "RANK_EXITED", "severity": "hang",
                     "culprit_ranks": [2]}

    async def scenario(job_id: str, let_go: bool = False) -> None:
        hub.ingest(report("node-a", *(dataclasses.replace(r, job_id=job_id) for r in ranks)),
                   T0 + 5.0)
        told(hub.judgements[job_id], hub.jobs[job_id], {**exit_incident, "job_id": job_id})
        if let_go:
            hub.let_go(job_id)
        for at in (5.0, 14.9, 15.1, 20.0):
            await asyncio.gather(*hub.evaluate_all(T0 + at))

    asyncio.run(scenario(JOB))
    ((said,),) = [still]
    assert said.incident["id"] == "e1" and said.waiting == (0, 1, 3)
    assert round(said.waited, 1) == 10.1
    asyncio.run(scenario("ended", let_go=True))
    assert len(still) == 1


def judge_exit(tmp_path: Path, settle: float, later: tuple[RankState, ...]) -> dict[str, Any]:
    """Rank 3 raised (node-a's report); `later` arrives from node-b 0.1 s after the coordinator
    began to judge it. The incident told, and within how long."""
    hub = Coordinator(SqliteStore(str(tmp_path / "incidents.db")), StallPolicy(), tick=0.01)
    heard: list[dict[str, Any]] = []
    hub.listeners.append(heard.append)

    async def scenario() -> None:
        now = time.time()
        hub.ingest(report("node-b", *(rank(r) for r in (0, 1, 2))), now)
        hub.ingest(report("node-a", raised(3, at=0.0)), now)
        hub.evaluate_all(now)
        await asyncio.sleep(0.1)
        hub.ingest(report("node-b", *later), now + 0.1)
        await asyncio.wait_for(hub.settled(), settle + 5.0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settling, "EXIT_SETTLE_S", settle)
        asyncio.run(scenario())
    assert len(heard) == 1
    return heard[0]


def test_an_exit_that_raised_waits_for_the_peers_that_raised_alike(tmp_path: Path) -> None:
    incident = judge_exit(tmp_path, 30.0, tuple(raised(r, at=0.01) for r in (0, 1, 2)))
    assert incident["culprit_ranks"] == [0, 1, 2, 3]
    assert incident["summary"].startswith("all 4 ranks raised ValueError")


def test_an_exit_that_raised_waits_no_longer_for_peers_that_train_on(tmp_path: Path) -> None:
    started = time.monotonic()
    incident = judge_exit(tmp_path, 30.0, tuple(rank(r, steps=57) for r in (0, 1, 2)))
    assert incident["culprit_ranks"] == [3]
    assert time.monotonic() - started < 10.0


def test_an_exit_that_raised_waits_a_bounded_time(tmp_path: Path) -> None:
    incident = judge_exit(tmp_path, 0.5, tuple(rank(r) for r in (0, 1, 2)))
    assert incident["culprit_ranks"] == [3]


def test_full_collections_are_spared_while_the_coordinator_runs_and_put_back_after() -> None:
    before = gc.get_threshold()
    with sparing_full_collections():
        assert gc.get_threshold() == (*before[:2], FULL_EVERY)
    assert gc.get_threshold() == before
