"""The verdict engine on snapshots shaped like those of a 4-rank gloo DDP job (watchdog._demo).

Each DDP forward enters an "all_reduce" on group "0" that completes at the optimizer step, so at
step 56 the world group stands at #56 completed, and a rank inside step 57 has #57 pending.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.builders import (
    AFTER_BACKWARD,
    BARRIER,
    DATA_STALL,
    DDP_BACKWARD,
    FORWARD_LOOP,
    IDLE_WORKER,
    IMPORTING_TORCH,
    IN_RENDEZVOUS,
    PAIR,
    SAMPLER_SHUFFLE,
    SITE,
    STUCK_WORKER,
    T0,
    TRAIN,
    WORLD,
    data_pipeline,
    done,
    entered,
    exited,
    raised,
    rank,
    snapshot,
    stuck_after_backward,
    unhooked,
    utc,  # noqa: F401 - the autouse fixture that pins local time to UTC
    with_children,
    world_ref,
)
from watchdog.beacon import MAX_LISTED_RANKS
from watchdog.coordinator.verdict import decide
from watchdog.coordinator.view import StallView
from watchdog.model import (
    ChildStack,
    CollectiveRef,
    ExitReason,
    Frame,
    GroupProgress,
    Kind,
)

CASES = {
    "data pipeline: rank 1 never reached #57": (
        data_pipeline(),
        (Kind.MISSING_RANKS, (1,), (0, 2, 3), world_ref(57)),
    ),
    "rank 1 stuck after its backward: its all-reduce #57 done, still pending in its beacon": (
        stuck_after_backward({0: DDP_BACKWARD, 1: AFTER_BACKWARD, 2: DDP_BACKWARD,
                              3: DDP_BACKWARD}),
        (Kind.MISSING_RANKS, (1,), (0, 2, 3), world_ref(58)),
    ),
    "the same with no stacks: the peers' #58 says rank 1 is past #57": (
        stuck_after_backward(),
        (Kind.MISSING_RANKS, (1,), (0, 2, 3), world_ref(58)),
    ),
    "rank 0 can be the culprit": (
        snapshot(
            rank(0, done(56, 2.6)),
            rank(1, entered(57, 3.1)),
            rank(2, entered(57, 3.2)),
            rank(3, entered(57, 3.3)),
        ),
        (Kind.MISSING_RANKS, (0,), (1, 2, 3), world_ref(57)),
    ),
    "trap: rank 0 in a barrier, the others in DDP's all-reduce": (
        snapshot(
            rank(0, entered(57, 3.0, op="barrier")),
            rank(1, entered(57, 3.1)),
            rank(2, entered(57, 3.2)),
            rank(3, entered(57, 3.3)),
        ),
        (Kind.COLLECTIVE_MISMATCH, (0,), (1, 2, 3), world_ref(57)),
    ),
    "subgroup: rank 1 never reached its pair's collective": (
        snapshot(
            rank(0, done(57, 3.0), entered(5, 4.0, group="1", ranks=PAIR)),
            rank(1, done(57, 3.1), done(4, 1.0, group="1", ranks=PAIR)),
            rank(2, entered(58, 5.0)),
            rank(3, entered(58, 5.2)),
        ),
        (Kind.MISSING_RANKS, (1,), (0, 2, 3), CollectiveRef("1", PAIR, 5, "all_reduce")),
    ),
    "subgroup where both members wait: a fault in that group": (
        snapshot(
            rank(0, done(57, 3.0), entered(5, 4.0, group="1", ranks=PAIR)),
            rank(1, done(57, 3.1), entered(5, 4.1, group="1", ranks=PAIR)),
            rank(2, entered(58, 5.0)),
            rank(3, entered(58, 5.2)),
        ),
        (Kind.ALL_IN_COLLECTIVE, (), (0, 1), CollectiveRef("1", PAIR, 5, "all_reduce")),
    ),
    "a cycle across groups: rank 0 waits in its pair, the others in the world": (
        snapshot(
            rank(0, done(57, 3.0), entered(5, 4.0, group="1", ranks=PAIR)),
            rank(1, entered(58, 5.1), done(4, 1.0, group="1", ranks=PAIR)),
            rank(2, entered(58, 5.0)),
            rank(3, entered(58, 5.2)),
        ),
        (Kind.COLLECTIVE_MISMATCH, (0,), (1, 2, 3), world_ref(58)),
    ),
    "early exit with code 0, the others failed later": (
        snapshot(
            exited(rank(3, done(56, 2.6)), at=3.0, code=0, clean=True),
            exited(rank(0, entered(57, 3.1)), at=1803.0, code=1, clean=True),
            exited(rank(1, entered(57, 3.2)), at=1803.1, code=1, clean=True),
            exited(rank(2, entered(57, 3.3)), at=1803.2, code=1, clean=True),
            stalled=False,
        ),
        # the peers died waiting in #57, which rank 3 never entered
        (Kind.RANK_EXITED, (3,), (0, 1, 2), CollectiveRef("0", (0, 1, 2, 3), 57, "all_reduce")),
    ),
    "early exit while the others wait for it, before any stall": (
        snapshot(
            rank(0, entered(57, 3.1)),
            rank(1, entered(57, 3.2)),
            rank(2, entered(57, 3.3)),
            exited(rank(3, done(56, 2.6)), at=3.0, code=0, clean=True),
            stalled=False,
        ),
        (Kind.RANK_EXITED, (3,), (0, 1, 2), world_ref(57)),
    ),
    "SIGSTOPped inside the all-reduce: stopped beats all-in-collective": (
        snapshot(
            rank(0, entered(57, 3.1)),
            rank(1, entered(57, 3.2)),
            rank(2, entered(57, 3.0), proc_state="T", heartbeat_age=40.0),
            rank(3, entered(57, 3.3)),
        ),
        (Kind.RANK_WEDGED, (2,), (0, 1, 3), None),
    ),
    "GIL held in native code: silent heartbeat outside any collective": (
        data_pipeline(heartbeat_age=38.5),
        (Kind.RANK_WEDGED, (1,), (0, 2, 3), None),
    ),
    "a silent heartbeat in a collective the others wait in too is the wait itself": (
        snapshot(
            rank(0, entered(57, 3.1)),
            rank(1, entered(57, 3.2), heartbeat_age=30.0),
            rank(2, entered(57, 3.3)),
            rank(3, entered(57, 3.4)),
        ),
        (Kind.ALL_IN_COLLECTIVE, (), (0, 1, 2, 3), world_ref(57)),
    ),
    "all in the same all-reduce, none completed": (
        snapshot(*(rank(r, entered(57, 3.0 + r / 10)) for r in WORLD)),
        (Kind.ALL_IN_COLLECTIVE, (), (0, 1, 2, 3), world_ref(57)),
    ),
    "nothing pending anywhere": (
        snapshot(*(rank(r, done(57, 3.0 + r / 10)) for r in WORLD)),
        (Kind.RANK_STALLED, (0, 1, 2, 3), (), None),
    ),
    "rank 1 in a checkpoint phase with time left": (
        data_pipeline(phase="checkpoint", phase_age=30.0, phase_timeout=600.0),
        None,
    ),
    "rank 1's checkpoint phase ran out of time": (
        data_pipeline(phase="checkpoint", phase_age=700.0, phase_timeout=600.0),
        (Kind.MISSING_RANKS, (1,), (0, 2, 3), world_ref(57)),
    ),
    "not stalled": (data_pipeline(stalled=False), None),
    "normal finish": (
        snapshot(
            *(exited(rank(r, done(1000, 60.0)), 61.0 + r, code=0, clean=True) for r in WORLD),
            stalled=False,
        ),
        None,
    ),
    "one rank finished first while the others finish their last step": (
        snapshot(
            exited(rank(0, done(1000, 60.0)), 60.5, code=0, clean=True),
            *(rank(r, entered(1000, 60.1)) for r in (1, 2, 3)),
            stalled=False,
        ),
        None,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_verdict(case: str) -> None:
    job, expected = CASES[case]
    verdict = decide(job)
    got = (
        None
        if verdict is None
        else (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks, verdict.collective)
    )
    assert got == expected


def test_data_pipeline_summary_names_collective_waiters_and_time() -> None:
    verdict = decide(data_pipeline())
    assert verdict is not None
    assert verdict.summary == (
        "rank 1 never reached all_reduce #57 on group 0 (world); ranks 0,2,3 wait there "
        "since 12:00:03"
    )


def test_summary_says_where_the_culprit_is_stuck_in_its_own_code() -> None:
    verdict = decide(
        data_pipeline(stacks={0: DDP_BACKWARD, 1: DATA_STALL, 2: DDP_BACKWARD, 3: DDP_BACKWARD})
    )
    assert verdict is not None
    assert verdict.summary.startswith(
        "rank 1 (stuck in read_sample_from_storage at train.py:42) never reached all_reduce #57"
    )


def test_summary_names_the_dataloader_worker_a_rank_waits_for() -> None:
    verdict = decide(with_children(IDLE_WORKER, STUCK_WORKER))
    assert verdict is not None
    assert verdict.summary.startswith(
        "rank 1 (waits for its DataLoader worker 1 (pid 5001), stuck in read_shard at data.py:16)"
        " never reached all_reduce #57")


@pytest.mark.parametrize("worker", [dataclasses.replace(STUCK_WORKER, cpu=0.98),
                                    dataclasses.replace(STUCK_WORKER, moved=True)])
def test_a_working_dataloader_worker_is_its_ranks_progress(worker: ChildStack) -> None:
    job = with_children(IDLE_WORKER, worker)
    sign = StallView.of(job).alive[1].progress
    assert sign == ("its DataLoader worker 1 (pid 5001) using 98% of a core" if worker.cpu else
                    "its DataLoader worker 1 (pid 5001) running Python (its stack moving)")
    verdict = decide(job)
    assert verdict is not None and "waits for its DataLoader worker" not in verdict.summary


def test_a_rank_whose_workers_all_idle_is_stuck_in_its_own_code() -> None:
    verdict = decide(with_children(IDLE_WORKER))
    assert verdict is not None
    assert verdict.summary.startswith("rank 1 (stuck in main at train.py:104) never reached")


def test_trap_summary_shows_both_sides() -> None:
    verdict = decide(
        snapshot(
            rank(0, entered(57, 3.0, op="barrier")),
            rank(1, entered(57, 3.1)),
            rank(2, entered(57, 3.2)),
            rank(3, entered(57, 3.3)),
            stacks={0: BARRIER, 1: DDP_BACKWARD, 2: DDP_BACKWARD, 3: DDP_BACKWARD},
        )
    )
    assert verdict is not None
    assert verdict.summary == (
        "rank 0 (stuck in save_checkpoint at train.py:58) is in barrier #57 on group 0 (world) "
        "while ranks 1-3 are in all_reduce #57 since 12:00:03"
    )


def test_subgroup_summary_names_the_pair_and_the_other_waiters() -> None:
    job, _ = CASES["subgroup: rank 1 never reached its pair's collective"]
    verdict = decide(job)
    assert verdict is not None
    assert verdict.summary == (
        "rank 1 never reached all_reduce #5 on group 1 (ranks 0,1); rank 0 waits there since "
        "12:00:04; ranks 2,3 wait in all_reduce #58 on group 0 (world) since 12:00:05"
    )


@pytest.mark.parametrize(
    ("code", "clean", "words"),
    [
        (0, True, "(exit code 0, clean shutdown)"),
        (None, False, "(killed/unknown exit code, no clean shutdown)"),
    ],
)
def test_exit_summary_gives_exit_code_and_shutdown(
    code: int | None, clean: bool, words: str
) -> None:
    verdict = decide(
        snapshot(
            exited(rank(2, done(56, 2.6)), at=3.0, code=code, clean=clean),
            rank(0, entered(57, 3.1)),
            rank(1, entered(57, 3.2)),
            rank(3, entered(57, 3.3)),
            stalled=False,
        )
    )
    assert verdict is not None
    assert verdict.culprit_ranks == (2,)
    expected = f"rank 2 exited first at 12:00:03 {words} while ranks 0,1,3 still needed it"
    assert verdict.summary == expected


RAISED = ExitReason(
    "RuntimeError", "DataLoader worker (pid 4242) is killed by signal: Killed.\nsecond line",
    (Frame("handler", f"{SITE}/torch/utils/data/_utils/signal_handling.py", 73),
     Frame("_try_get_data", f"{SITE}/torch/utils/data/dataloader.py", 1243),
     Frame("main", TRAIN, 88)))


@pytest.mark.parametrize(
    ("code", "reason", "expected", "category"),
    [
        (1, RAISED, "rank 2's DataLoader worker (pid 4242) was killed by SIGKILL; rank 2 raised "
         "RuntimeError at train.py:88 and exited first at 12:00:03 (exit code 1, no clean "
         "shutdown)", None),
        (1, dataclasses.replace(RAISED, oom_killed=True), "rank 2's DataLoader worker (pid "
         "4242) was killed by SIGKILL (the kernel's OOM killer); rank 2 raised RuntimeError at "
         "train.py:88 and exited first at 12:00:03 (exit code 1, no clean shutdown)", None),
        (1, ExitReason("RuntimeError", "DataLoader worker (pid 77) exited unexpectedly with exit "
                                       "code 1. Details are lost due to multiprocessing."),
         "rank 2's DataLoader worker (pid 77) died (exit code 1); rank 2 raised RuntimeError and "
         "exited first at 12:00:03 (exit code 1, no clean shutdown)", None),
        (1, ExitReason("RuntimeError", "shard 7 is corrupt", oom_killed=True), "rank 2 raised "
         "RuntimeError: shard 7 is corrupt and exited first at 12:00:03 (exit code 1, no clean "
         "shutdown)", None),
        (None, ExitReason(signal="SIGKILL", oom_killed=True), "rank 2 was killed by SIGKILL "
         "(the kernel's OOM killer) at 12:00:03, the first to exit,", None),
        (1, ExitReason("ValueError", "Error initializing torch.distributed using env:// "
                                     "rendezvous: environment variable MASTER_ADDR expected, "
                                     "but not set"),
         "rank 2 raised ValueError: Error initializing torch.distributed using env:// "
         "rendezvous: environment variable MASTER_ADDR expected, but not set and exited first "
         "at 12:00:03 (exit code 1, no clean shutdown)", "ENV_MISSING"),
    ],
)
def test_exit_summary_says_what_the_rank_raised_or_what_killed_it(
    code: int | None, reason: ExitReason, expected: str, category: str | None
) -> None:
    verdict = decide(
        snapshot(
            dataclasses.replace(exited(rank(2, done(56, 2.6)), at=3.0, code=code, clean=False),
                                exit_reason=reason),
            rank(0, entered(57, 3.1)), rank(1, entered(57, 3.2)), rank(3, entered(57, 3.3)),
            stalled=False,
        )
    )
    assert verdict is not None
    assert verdict.summary == f"{expected} while ranks 0,1,3 still needed it"
    assert (verdict.advice.category if verdict.advice else None) == category


# What rank 0 of a gloo job raised when rank 1 was killed, from a real run.
PEER_CLOSED = ExitReason(
    "RuntimeError", "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:13513. This is typically caused by a remote worker "
    "crashing. Check the logs of the remote worker before reporting an error. GLHF!",
    (Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2950),
     Frame("main", TRAIN, 289)))


@pytest.mark.parametrize("killed_after", [0.016, -0.016])
def test_a_rank_that_lost_its_peer_is_not_blamed_for_the_peer_killed_about_then(
        killed_after: float) -> None:
    """The times of a real run where the kernel dated the SIGKILL 16 ms after rank 0 raised."""
    lost = dataclasses.replace(exited(rank(0, entered(3, 0.9)), at=1.0, code=1, clean=False),
                               exit_reason=PEER_CLOSED)
    killed = dataclasses.replace(exited(rank(1, done(2, 0.5)), at=1.0 + killed_after, code=None,
                                        clean=False), exit_reason=ExitReason(signal="SIGKILL"))
    verdict = decide(snapshot(lost, killed, stalled=False))
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks) == (Kind.RANK_EXITED, (1,))
    assert verdict.summary.startswith("rank 1 was killed by SIGKILL at ")


def test_when_every_rank_lost_a_peer_the_first_to_exit_is_named() -> None:
    first, second = (
        dataclasses.replace(exited(rank(r, entered(3, 0.9)), at=at, code=1, clean=False),
                            exit_reason=PEER_CLOSED) for r, at in ((1, 1.0), (0, 1.2)))
    verdict = decide(snapshot(second, first, stalled=False))
    assert verdict is not None
    assert verdict.culprit_ranks == (1,)


def test_mismatch_between_equal_sides_blames_the_side_with_the_lowest_rank() -> None:
    job = snapshot(
        rank(0, entered(57, 3.0, ranks=PAIR)), rank(1, entered(57, 3.1, op="barrier", ranks=PAIR))
    )
    reversed_ops = snapshot(
        rank(0, entered(57, 3.0, op="barrier", ranks=PAIR)), rank(1, entered(57, 3.1, ranks=PAIR))
    )
    for case in (job, reversed_ops):
        verdict = decide(case)
        assert verdict is not None
        assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
            Kind.COLLECTIVE_MISMATCH,
            (0,),
            (1,),
        )


def test_stack_shows_a_rank_that_entered_ddp_forward_but_never_reached_backward() -> None:
    job = snapshot(
        *(rank(r, entered(57, 3.0 + r / 10)) for r in WORLD),
        stacks={0: DDP_BACKWARD, 1: FORWARD_LOOP, 2: DDP_BACKWARD, 3: DDP_BACKWARD},
    )
    verdict = decide(job)
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
        Kind.MISSING_RANKS,
        (1,),
        (0, 2, 3),
    )
    assert "stuck in forward at model.py:12" in verdict.summary


@pytest.mark.parametrize(
    ("stacks", "expected"),
    [
        (
            {0: DDP_BACKWARD, 1: DATA_STALL, 2: DDP_BACKWARD, 3: DDP_BACKWARD},
            (Kind.MISSING_RANKS, (1,), (0, 2, 3)),
        ),
        ({r: DDP_BACKWARD for r in WORLD}, (Kind.ALL_IN_COLLECTIVE, (), (0, 1, 2, 3))),
        ({r: DATA_STALL for r in WORLD}, (Kind.RANK_STALLED, (0, 1, 2, 3), ())),
    ],
    ids=["one rank outside", "all inside", "none inside"],
)
def test_stacks_only_job(
    stacks: dict[int, tuple[Frame, ...]], expected: tuple[str, tuple[int, ...], tuple[int, ...]]
) -> None:
    verdict = decide(snapshot(*(unhooked(r) for r in WORLD), stacks=stacks))
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == expected
    assert verdict.collective is None


def test_stacks_only_summary_names_where_the_waiters_wait() -> None:
    verdict = decide(
        snapshot(
            *(unhooked(r) for r in WORLD),
            stacks={0: DDP_BACKWARD, 1: DATA_STALL, 2: DDP_BACKWARD, 3: DDP_BACKWARD},
        )
    )
    assert verdict is not None
    assert verdict.summary == (
        "rank 1 (stuck in read_sample_from_storage at train.py:42) never reached the collective "
        "that ranks 0,2,3 wait in (_engine_run_backward called at train.py:112)"
    )


_progress = st.builds(
    lambda group, seq, op, pending, at: GroupProgress(
        group, WORLD if group == "0" else PAIR, seq, op, seq - pending, T0 + at
    ),
    st.sampled_from(["0", "1"]),
    st.integers(1, 4),
    st.sampled_from(["all_reduce", "barrier"]),
    st.integers(0, 1),
    st.floats(0, 10),
)
_rank_states = st.builds(
    lambda groups, state, heartbeat, gone, hooked: (groups, state, heartbeat, gone, hooked),
    st.lists(_progress, max_size=2, unique_by=lambda p: p.group),
    st.sampled_from(["S", "R", "D", "T"]),
    st.sampled_from([0.2, 30.0]),
    st.sampled_from([None, (1.0, 0, True), (2.0, 1, False), (3.0, None, False)]),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_rank_states, min_size=4, max_size=4), st.booleans(), st.sets(st.sampled_from(WORLD))
)
def test_any_snapshot_gets_a_consistent_verdict(
    states: list[Any], stalled: bool, with_stacks: set[int]
) -> None:
    ranks = []
    for number, (groups, state, heartbeat, gone, hooked) in enumerate(states):
        one = rank(
            number,
            *(groups if hooked else ()),
            proc_state=state,
            heartbeat_age=heartbeat,
            hooked=hooked,
        )
        ranks.append(one if gone is None else exited(one, *gone))
    stacks = {r: (DDP_BACKWARD if r % 2 else DATA_STALL) for r in with_stacks}
    verdict = decide(snapshot(*ranks, stalled=stalled, stacks=stacks))
    if verdict is None:
        return
    assert set(verdict.culprit_ranks) <= set(WORLD)
    assert not set(verdict.culprit_ranks) & set(verdict.waiting_ranks)
    assert verdict.summary
    assert stalled or verdict.kind == Kind.RANK_EXITED


def test_a_rank_that_never_reached_ddps_constructor_is_named_with_what_the_others_wait_in(
) -> None:
    """DDP's constructor's shape check, recorded by the hook as ddp_init #1, reads as what it
    is; the JSON keeps the op's name."""
    job = snapshot(
        *(rank(r, entered(1, 2.0 + r / 10, op="ddp_init"), steps=0) for r in (0, 1, 3)),
        rank(2, done(0, 0.0, op=""), steps=0),
        stacks={2: (Frame("load_pretrained", TRAIN, 40), Frame("main", TRAIN, 90))},
    )
    verdict = decide(job)
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks, verdict.collective) == (
        Kind.MISSING_RANKS, (2,), (0, 1, 3), world_ref(1, "ddp_init"))
    assert verdict.summary == (
        "rank 2 (stuck in load_pretrained at train.py:40) never reached DDP's initial parameter "
        "broadcast (ddp_init #1 on group 0 (world)); ranks 0,1,3 wait there since 12:00:02")


def test_rank_still_importing_torch_while_the_others_wait_in_init() -> None:
    """Hooked ranks report no group before init_process_group returns: stacks decide."""
    stacks = {0: IMPORTING_TORCH, 1: IN_RENDEZVOUS, 2: IN_RENDEZVOUS, 3: IN_RENDEZVOUS}
    verdict = decide(snapshot(*(rank(r, steps=0) for r in WORLD), stacks=stacks))
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
        Kind.MISSING_RANKS,
        (0,),
        (1, 2, 3),
    )
    assert verdict.collective == CollectiveRef("0", WORLD, 0, "init_process_group")
    assert verdict.summary == (
        "rank 0 (stuck in <module> at train.py:14) never reached init_process_group; ranks 1-3 "
        "wait there (called at train.py:94)"
    )


def test_group_members_beyond_those_a_beacon_lists_still_count() -> None:
    """A beacon lists the first MAX_LISTED_RANKS members of a group (test_beacon checks it); a
    member past those shows by having the group in its own beacon. Here rank 290 skipped the
    group's collective #5 and went on to the world all-reduce, where rank 300, outside the
    group, waits with it."""
    world, members = tuple(range(301)), tuple(range(300))  # dist.new_group(range(300))
    listed = members[:MAX_LISTED_RANKS]
    ranks = [rank(300, entered(58, 5.0, ranks=world), world_size=301)]
    for number in members:
        if number == 290:
            progress = (entered(58, 5.1, ranks=world), done(4, 2.0, group="1", ranks=listed))
        else:
            progress = (done(57, 3.0, ranks=world), entered(5, 4.0, group="1", ranks=listed))
        ranks.append(rank(number, *progress, world_size=301))
    verdict = decide(snapshot(*ranks))
    assert verdict is not None
    # rank 300 shares rank 290's side of the mismatch: the engine blames the smaller side
    assert verdict.kind == Kind.COLLECTIVE_MISMATCH and 290 in verdict.culprit_ranks
    assert verdict.collective == CollectiveRef("1", members, 5, "all_reduce")
    assert "while ranks 0-289,291-299 wait in all_reduce #5 on group 1 (ranks 0-299)" in (
        verdict.summary)


def test_every_rank_that_raised_the_same_error_at_the_same_place_is_named() -> None:
    verdict = decide(snapshot(*(raised(r, at=3.0 + 0.004 * (3 - r)) for r in WORLD),
                              stalled=False))
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
        Kind.RANK_EXITED, WORLD, ())
    assert verdict.summary == (
        "all 4 ranks raised ValueError: sampler option is mutually exclusive with shuffle at "
        "train.py:262: a bug in the code, not a rank to blame")
    assert verdict.advice is not None and verdict.advice.category == "API_MISUSE"


def test_ranks_that_raised_alike_are_named_and_the_others_said_to_need_them() -> None:
    verdict = decide(snapshot(rank(0, entered(1, 2.9)), *(raised(r, at=3.0 + 0.01 * r)
                                                          for r in (1, 2, 3)), stalled=False))
    assert verdict is not None
    assert (verdict.culprit_ranks, verdict.waiting_ranks) == ((1, 2, 3), (0,))
    assert verdict.summary == (
        "ranks 1-3 all raised ValueError: sampler option is mutually exclusive with shuffle at "
        "train.py:262: a bug in the code, not a rank to blame; rank 0 still needed them")


INTERRUPTED = dataclasses.replace(SAMPLER_SHUFFLE, exception="KeyboardInterrupt", message="")


def test_ranks_the_user_interrupted_are_no_culprits() -> None:
    """Ctrl-C on torchrun: every worker raises KeyboardInterrupt; the user ended the job."""
    assert decide(snapshot(*(raised(r, at=3.0 + 0.004 * r, reason=INTERRUPTED) for r in WORLD),
                           stalled=False)) is None
    verdict = decide(snapshot(raised(0, at=3.0, reason=INTERRUPTED), raised(1, at=3.2),
                              rank(2, entered(1, 2.9)), rank(3, entered(1, 2.9)), stalled=False))
    assert verdict is not None and verdict.culprit_ranks == (1,), verdict


ELSEWHERE = dataclasses.replace(SAMPLER_SHUFFLE, frames=(
    Frame("__init__", f"{SITE}/torch/utils/data/dataloader.py", 375), Frame("main", TRAIN, 270)))
OTHER_TYPE = dataclasses.replace(SAMPLER_SHUFFLE, exception="TypeError")


@pytest.mark.parametrize("other", [ELSEWHERE, OTHER_TYPE, None])
def test_a_rank_whose_error_differs_in_type_or_place_is_named_alone(
        other: ExitReason | None) -> None:
    """Rank 2 raised first; rank 0 raised at another line, or another type, or not at all."""
    second = raised(0, at=3.1, reason=other) if other else rank(0, entered(1, 2.9))
    verdict = decide(snapshot(second, rank(1, entered(1, 2.9)), raised(2, at=3.0),
                              rank(3, entered(1, 2.9)), stalled=False))
    assert verdict is not None
    assert verdict.culprit_ranks == (2,)
    assert verdict.summary.startswith(
        "rank 2 raised ValueError: sampler option is mutually exclusive with shuffle at "
        "train.py:262 and exited first at 12:00:03 (exit code 1, clean shutdown) while ranks "
        "0,1,3 still needed it")


def test_the_first_rank_decides_which_error_is_grouped() -> None:
    """Ranks 1 and 3 raised alike, but after rank 0 raised something else: rank 0 is named."""
    verdict = decide(snapshot(raised(0, at=2.0, reason=ELSEWHERE), raised(1, at=3.0),
                              rank(2, entered(1, 1.9)), raised(3, at=3.1), stalled=False))
    assert verdict is not None
    assert verdict.culprit_ranks == (0,)
