"""The coordinator's findings, from real fingerprints: replicas of a real DDP module (in a
one-rank gloo group) fingerprinted by the hook's checks, published into a beacon, read back and
turned into rank states as the agent does; then compared, stored and announced once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.rankstate import check_evidence
from tests.helpers.builders import JOB, T0, done, entered, rank
from tests.helpers.recorders import ddp_linear, recorder, steps
from watchdog.beacon import CHECK_NAMES, open_beacon, read_beacon
from watchdog.coordinator import Coordinator, StallPolicy
from watchdog.coordinator.silent_bugs import (
    NO_SYNC_STEPS,
    SETTLE_S,
    FindingTracker,
    duplicated,
    replica_culprits,
)
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.coordinator.store import Retention
from watchdog.hook.checks import FIRST_CHECK
from watchdog.model import EVERY_JOB, CheckEvidence, JobSnapshot, Kind, NodeReport, RankState
from watchdog.report.terminal import render_status


def trained(tmp_path: Path, number: int, *, loaded: bool = False, batch: float | None = None,
            n_steps: int = FIRST_CHECK) -> RankState:
    """Rank `number` after `n_steps` optimizer steps of a DDP replica (a checkpoint loaded
    into it after wrapping, if `loaded`), feeding it `batch + number` (or `batch`, when
    negative, on every rank) after each check; as the agent reports it."""
    rec, ddp = recorder(tmp_path, frozenset(CHECK_NAMES), f"rank{number}"), ddp_linear()
    rec.checks.wrapped(ddp)
    if loaded:
        ddp.module.load_state_dict(torch.nn.Linear(8, 4).state_dict())
    for _ in range(n_steps):
        steps(rec, 1)
        if rec.checks.batch_due and batch is not None:
            value = -batch if batch < 0 else batch + number
            rec.checks.batch(ddp, (torch.full((4, 8), value),), {})
    rec.grad_synced()  # as an all_reduce of the gradients would
    rec.publish()
    snap = read_beacon(open_beacon(rec.writer.path))
    return rank(number, done(n_steps, 1.0), steps=n_steps, evidence=check_evidence(snap.checks))


def snapshot(*states: RankState) -> JobSnapshot:
    return JobSnapshot(JOB, 4, T0, 0.0, False, states)


def judge(tracker: FindingTracker, *states: RankState, now: float = T0) -> list[Any]:
    for state in states:
        tracker.observe(state)
    return tracker.evaluate(snapshot(*states), now)


@pytest.mark.parametrize(("digests", "culprits"), [
    ({0: 7, 1: 7, 2: 7, 3: 7}, ()),
    ({0: 1, 1: 7, 2: 7, 3: 7}, (0,)),
    ({0: 7, 1: 7, 2: 1, 3: 2}, (2, 3)),
    ({0: 1, 1: 7, 2: 7, 3: 1}, (0, 3)),  # a tie: the side holding the lowest rank
    ({0: 1, 1: 2, 2: 3, 3: 4}, (0, 1, 2, 3)),  # no two agree: every replica differs
    ({0: 1, 1: 7}, (0, 1)),
])
def test_the_minority_of_replicas_is_to_blame(digests: dict[int, int],
                                             culprits: tuple[int, ...]) -> None:
    assert replica_culprits(digests) == culprits


def test_duplicated_ranks_share_a_digest_with_another() -> None:
    assert duplicated({0: 1, 1: 2, 2: 1, 3: 3}) == {0, 2}
    assert duplicated({0: 1, 1: 2}) == set()


def test_a_replica_loaded_after_wrapping_is_named_once_every_member_reported(
        one_rank: None, tmp_path: Path) -> None:
    ranks = [trained(tmp_path, r, loaded=r == 0) for r in range(4)]
    tracker = FindingTracker()
    assert judge(tracker, *ranks[:3]) == []  # rank 3's fingerprint for step 8 is not in yet
    (finding,) = judge(tracker, ranks[3])
    assert (finding.kind, finding.culprit_ranks, finding.step) == (Kind.REPLICA_DESYNC, (0,),
                                                                    FIRST_CHECK)
    assert finding.summary == ("rank 0: the parameters of DDP module 0 differ from ranks "
                               "1-3's at step 8; the replicas of group 0 (world) are out of sync")
    assert "after wrapping" in finding.cause and "before wrapping" in finding.fix
    assert judge(tracker, *ranks) == []  # said once


def test_replicas_out_of_sync_at_two_checks_that_arrive_together_are_one_finding(
        one_rank: None, tmp_path: Path) -> None:
    """A coordinator busy for a while reads the fingerprints of steps 8 and 16 at once."""
    ranks = [trained(tmp_path, r, loaded=r == 2, n_steps=16) for r in range(4)]
    (finding,) = judge(FindingTracker(), *ranks)
    assert (finding.kind, finding.culprit_ranks, finding.step) == (Kind.REPLICA_DESYNC, (2,),
                                                                    FIRST_CHECK)


def test_replicas_in_sync_are_no_finding(one_rank: None, tmp_path: Path) -> None:
    ranks = [trained(tmp_path, r, batch=float(r), n_steps=16) for r in range(4)]
    tracker = FindingTracker()
    assert judge(tracker, *ranks) == []
    assert not tracker.pending


def test_identical_batches_at_two_checks_in_a_row_are_duplicate_data(one_rank: None,
                                                                     tmp_path: Path) -> None:
    once = [trained(tmp_path, r, batch=-1.0, n_steps=FIRST_CHECK) for r in range(4)]
    assert judge(FindingTracker(), *once) == []  # once may be chance
    twice = [trained(tmp_path, r, batch=-1.0, n_steps=16) for r in range(4)]
    (finding,) = judge(FindingTracker(), *twice)
    assert (finding.kind, finding.culprit_ranks, finding.step) == (
        Kind.DUPLICATE_DATA, (0, 1, 2, 3), FIRST_CHECK)
    assert "DistributedSampler" in finding.fix
    # ranks 0 and 2 share their data, ranks 1 and 3 their own (a sampler given the local rank)
    paired = [trained(tmp_path, r, batch=-(r % 2) - 1.0, n_steps=16) for r in range(4)]
    (finding,) = judge(FindingTracker(), *paired)
    assert finding.culprit_ranks == (0, 1, 2, 3)


def test_a_rank_that_runs_no_replica_check_is_not_waited_for(one_rank: None,
                                                             tmp_path: Path) -> None:
    ranks = [trained(tmp_path, r, loaded=r == 1) for r in range(3)]
    unchecked = rank(3, done(8, 1.0), steps=8, evidence=CheckEvidence(checks=("no_grad_sync",)))
    (finding,) = judge(FindingTracker(), *ranks, unchecked)
    assert finding.culprit_ranks == (1,)


def unsynced(number: int, n: int, world: int = 4) -> RankState:
    evidence = CheckEvidence(checks=("no_grad_sync",), unsynced_steps=n)
    return rank(number, steps=40, world_size=world, evidence=evidence)


def test_no_grad_sync_waits_for_every_rank_or_the_settle_time() -> None:
    tracker = FindingTracker()
    late = [unsynced(r, NO_SYNC_STEPS + 5) for r in range(3)] + [unsynced(3, 2)]
    assert judge(tracker, *late) == []
    (finding,) = judge(tracker, *late, now=T0 + SETTLE_S)
    assert (finding.kind, finding.culprit_ranks, finding.step) == (Kind.NO_GRAD_SYNC, (0, 1, 2),
                                                                    16)
    everyone = FindingTracker()
    (finding,) = judge(everyone, *(unsynced(r, NO_SYNC_STEPS) for r in range(4)))
    assert finding.culprit_ranks == (0, 1, 2, 3)
    assert finding.summary.startswith("ranks 0-3 stepped their optimizers from step 21 on")
    alone = FindingTracker()
    assert judge(alone, unsynced(0, 100, world=1), now=T0 + 60) == []


def coordinator(tmp_path: Path) -> Coordinator:
    """One whose store keeps incidents dated T0 beside those dated by the clock (stacks')."""
    store = SqliteStore(str(tmp_path / "incidents.db"), Retention(days=36500))
    return Coordinator(store, StallPolicy(fixed=5.0))


def judge_all(hub: Coordinator, now: float) -> None:
    """Judge every job as of `now`, and wait for what that started (findings are stored and
    told in tasks)."""
    async def tasks() -> None:
        await asyncio.gather(*hub.evaluate_all(now))

    asyncio.run(tasks())


def test_a_warning_is_stored_and_said_once_and_never_hides_a_later_hang(
        one_rank: None, tmp_path: Path) -> None:
    hub, heard = coordinator(tmp_path), []
    hub.listeners.append(heard.append)
    replicas = [trained(tmp_path, r, loaded=r == 2) for r in range(4)]
    # then rank 1 stops in its data loading while ranks 0, 2, 3 wait in the all-reduce
    stuck = [dataclasses.replace(r, groups=(done(56, 2.0) if r.rank == 1 else entered(57, 3.0),))
             for r in replicas]

    async def scenario() -> None:
        hub.ingest(NodeReport("node-a", T0, tuple(replicas)), T0 - 1)
        await asyncio.gather(*hub.evaluate_all(T0 - 1))
        for at in (T0, T0 + 5.1):
            hub.ingest(NodeReport("node-a", at, tuple(stuck)), at)
            await asyncio.gather(*hub.evaluate_all(at))

    asyncio.run(scenario())
    warning, hang = heard
    assert (warning["kind"], warning["severity"], warning["culprit_ranks"]) == (
        "REPLICA_DESYNC", "warning", [2])
    assert warning["finding"]["step"] == FIRST_CHECK and warning["finding"]["fix"]
    assert (hang["kind"], hang["severity"], hang["culprit_ranks"]) == ("MISSING_RANKS", "hang",
                                                                        [1])
    stored = [json.loads(stored.text) for stored in hub.store.listed()]
    assert [i["kind"] for i in stored] == ["MISSING_RANKS", "REPLICA_DESYNC"]
    (job,) = json.loads(hub.status_json(EVERY_JOB))["jobs"]
    assert (job["state"], job["verdict"]["kind"]) == ("HUNG", "MISSING_RANKS")
    assert [f["kind"] for f in job["findings"]] == ["REPLICA_DESYNC"]

    again = Coordinator(hub.store, StallPolicy())  # restarted: the same finding is not news
    again.listeners.append(heard.append)
    again.ingest(NodeReport("node-a", T0, tuple(replicas)), T0 + 10)
    judge_all(again, T0 + 10)
    assert len(heard) == 2
    (job,) = json.loads(again.status_json(EVERY_JOB))["jobs"]
    assert [f["id"] for f in job["findings"]] == [warning["id"]]


def test_a_job_with_a_warning_is_running(one_rank: None, tmp_path: Path) -> None:
    hub, now = coordinator(tmp_path), time.time()  # status is as of the clock
    replicas = [dataclasses.replace(trained(tmp_path, r, loaded=r == 2), last_event_at=now)
                for r in range(4)]
    hub.ingest(NodeReport("node-a", now, tuple(replicas)), now)
    judge_all(hub, now)
    status = json.loads(hub.status_json(EVERY_JOB))
    (job,) = status["jobs"]
    assert (job["state"], job["verdict"]) == ("RUNNING", None)
    assert [(f["kind"], f["severity"]) for f in job["findings"]] == [("REPLICA_DESYNC", "warning")]
    text = render_status(status)
    assert f"{JOB}  RUNNING  world size 4" in text
    assert "REPLICA_DESYNC (warning): rank 2: the parameters of DDP module 0 differ" in text
    assert "  fix: Start every rank from the same weights" in text


def test_a_fault_in_the_findings_never_stops_hang_judgement(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = coordinator(tmp_path)
    evidence = CheckEvidence(checks=("no_grad_sync",), unsynced_steps=NO_SYNC_STEPS)
    stuck = [rank(1, done(56, 2.0), evidence=evidence),
             *(rank(r, entered(57, 3.0), evidence=evidence) for r in (0, 2, 3))]
    hub.ingest(NodeReport("node-a", T0, tuple(dataclasses.replace(s, events=0) for s in stuck)),
               T0 - 1)
    judge_all(hub, T0 - 1)

    def broken(*_: Any) -> list[Any]:
        raise RuntimeError("a bug in a finding")

    monkeypatch.setattr(hub.jobs[JOB].findings, "evaluate", broken)

    async def judge(at: float) -> int:
        hub.ingest(NodeReport("node-a", at, tuple(stuck)), at)
        tasks = hub.evaluate_all(at)
        await asyncio.gather(*tasks)
        return len(tasks)

    assert asyncio.run(judge(T0)) == 0
    assert asyncio.run(judge(T0 + 5.1)) == 1
    incident = hub.judgements[JOB].incident
    assert incident is not None and incident["kind"] == "MISSING_RANKS"
