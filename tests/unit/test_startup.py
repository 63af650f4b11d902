"""Start-up verdicts (coordinator.startup through `decide`): ranks that wait in
init_process_group or new_group for members that never come, on snapshots shaped like those of
real gloo jobs (the stacks were taken by py-spy from such ranks, watchdog/demo/train.py)."""

from __future__ import annotations

import dataclasses

from tests.helpers.builders import (
    IN_RENDEZVOUS,
    PACKAGE,
    PREPARING,
    SITE,
    T0,
    TRAIN,
    WORLD,
    done,
    joining,
    rank,
)
from watchdog.coordinator.verdict import decide
from watchdog.model import (
    Activity,
    CollectiveRef,
    Frame,
    JobSnapshot,
    Kind,
    RankStack,
    RankState,
    Verdict,
)

STORE = f"{SITE}/torch/distributed/rendezvous.py"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
CONNECTING = (  # MASTER_ADDR=192.0.2.1: the store client retries its connect until the timeout
    Frame("_create_c10d_store", STORE, 199),
    Frame("_env_rendezvous_handler", STORE, 280),
    Frame("init_process_group", C10D, 1892),
    Frame("_time_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 97),
    Frame("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
    Frame("_setting_up.<locals>.wrapper", str(PACKAGE / "hook" / "patches" / "group_setup.py"), 69),
    Frame("main", TRAIN, 94),
)
IN_NEW_GROUP = (
    Frame("_new_process_group_helper", C10D, 2169),
    Frame("_new_group_with_tag", C10D, 5455),
    Frame("new_group", C10D, 5300),
    Frame("main", TRAIN, 97),
)
INIT = CollectiveRef("0", WORLD, 0, "init_process_group")


def judge(*ranks: RankState, stacks: dict[int, tuple[Frame, ...]], world: int = 4,
          duplicates: dict[int, tuple[tuple[str, int], ...]] | None = None) -> Verdict:
    taken = {r: RankStack(r, 4242 + r, frames) for r, frames in stacks.items()}
    verdict = decide(JobSnapshot("job", world, T0 + 45, 62.0, True, ranks, taken,
                                 duplicates=duplicates or {}))
    assert verdict is not None
    return verdict


def test_a_rank_in_its_own_code_never_reached_init_process_group() -> None:
    verdict = judge(*(joining(r) for r in (0, 1, 2)), rank(3, steps=0, events=0),
                    stacks={0: IN_RENDEZVOUS, 1: IN_RENDEZVOUS, 2: IN_RENDEZVOUS, 3: PREPARING})
    assert verdict == dataclasses.replace(
        verdict, kind=Kind.MISSING_RANKS, culprit_ranks=(3,), waiting_ranks=(0, 1, 2),
        collective=INIT, advice=None)
    assert verdict.summary == (
        "rank 3 (stuck in prepare_dataset at train.py:111) never reached init_process_group; "
        "ranks 0-2 wait there since 12:00:15 (called at train.py:94)")


def test_a_rank_still_importing_torch_with_its_cpu_busy_is_a_notice_not_a_hang() -> None:
    """A slow start-up: the culprit works, so the warm-up's end does not make it a hang."""
    busy = rank(3, steps=0, events=0, activity=Activity(5.0, main_cpu=0.9, process_cpu=0.95))
    verdict = judge(*(joining(r) for r in (0, 1, 2)), busy,
                    stacks={0: IN_RENDEZVOUS, 1: IN_RENDEZVOUS, 2: IN_RENDEZVOUS, 3: PREPARING})
    assert verdict.kind == Kind.RANK_BUSY


def test_ranks_that_never_reported_never_started_and_a_duplicate_says_why() -> None:
    ranks = [joining(r) for r in (0, 1, 2)]
    stacks = {r: IN_RENDEZVOUS for r in (0, 1, 2)}
    verdict = judge(*ranks, stacks=stacks)
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
        Kind.MISSING_RANKS, (3,), (0, 1, 2))
    assert verdict.summary.startswith(
        "rank 3 never started: no process of this job reported it; ranks 0-2 wait in "
        "init_process_group since 12:00:15")
    assert verdict.advice.category == "RENDEZVOUS"
    twice = judge(*ranks, stacks=stacks, duplicates={1: (("node-a", 4243), ("node-b", 977))})
    assert twice.summary.endswith(
        "; rank 1 is claimed by 2 processes (pid 4243 on node-a and pid 977 on node-b)")
    assert twice.advice.cause.startswith(
        "two processes claimed rank 1, so rank 3 has none")


def test_ranks_that_cannot_reach_the_store_are_told_its_address() -> None:
    unreachable = {"rendezvous": "env://192.0.2.1:29613"}
    every = judge(*(joining(r, **unreachable) for r in (0, 1)), world=2,
                  stacks={0: CONNECTING, 1: CONNECTING})
    assert (every.kind, every.culprit_ranks, every.waiting_ranks) == (
        Kind.ALL_IN_COLLECTIVE, (), (0, 1))
    assert every.summary == (
        "ranks 0,1 cannot connect to the rendezvous store at env://192.0.2.1:29613 in "
        "init_process_group since 12:00:15 (called at train.py:94)")
    assert every.advice.category == "CONNECT_FAILED"
    assert every.advice is not None
    assert "nothing answers at the rendezvous store env://192.0.2.1:29613" in every.advice.cause
    some = judge(joining(0), *(joining(r, **unreachable) for r in (1, 2, 3)),
                 stacks={0: IN_RENDEZVOUS, 1: CONNECTING, 2: CONNECTING, 3: CONNECTING})
    assert (some.kind, some.culprit_ranks, some.waiting_ranks) == (
        Kind.MISSING_RANKS, (1, 2, 3), (0,))


def test_ranks_past_the_store_that_cannot_connect_to_one_another() -> None:
    verdict = judge(*(joining(r) for r in WORLD), stacks={r: IN_RENDEZVOUS for r in WORLD})
    assert (verdict.kind, verdict.collective) == (Kind.ALL_IN_COLLECTIVE, INIT)
    assert "cannot connect to one another" in verdict.summary


def test_ranks_without_a_hook_are_judged_by_their_stacks() -> None:
    unhooked = [rank(r, hooked=False, heartbeat_age=None, steps=0, events=0) for r in WORLD]
    verdict = judge(*unhooked, stacks={0: PREPARING, 1: IN_RENDEZVOUS, 2: IN_RENDEZVOUS,
                                       3: IN_RENDEZVOUS})
    assert (verdict.kind, verdict.culprit_ranks, verdict.collective) == (
        Kind.MISSING_RANKS, (0,), INIT)


def test_a_rank_that_never_reaches_new_group() -> None:
    """Every rank of the world must call new_group; rank 3 is stuck in its data instead."""
    joined = [rank(r, done(56, 2.0), setup="new_group", setup_age=20.0) for r in (0, 1, 2)]
    late = rank(3, done(56, 2.0))
    verdict = judge(*joined, late, stacks={0: IN_NEW_GROUP, 1: IN_NEW_GROUP, 2: IN_NEW_GROUP,
                                           3: PREPARING})
    assert (verdict.kind, verdict.culprit_ranks, verdict.collective) == (
        Kind.MISSING_RANKS, (3,), CollectiveRef("0", WORLD, 0, "new_group"))
