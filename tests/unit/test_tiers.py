"""Busy or hung: what the evidence about a stalled job's culprit makes of the verdict. A hang
needs a culprit that shows no progress; one that works while its peers wait is RANK_BUSY until
the busy timeout; every rank working outside collectives is a long phase (no verdict)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import watchdog
from tests.helpers.builders import (
    BARRIER,
    DATA_STALL,
    DDP_BACKWARD,
    SITE,
    TRAIN,
    data_pipeline,
    done,
    entered,
    rank,
    snapshot,
)
from watchdog.coordinator.incident import stack_groups
from watchdog.coordinator.verdict import decide
from watchdog.model import Activity, Frame, JobSnapshot, Kind, RankStack

IDLE = Activity(window=3.0)  # measured: nothing at all, as every hung rank measured
COMPUTING = Activity(window=3.0, main_cpu=0.98, process_cpu=1.0)
WRITING = Activity(window=3.0, main_cpu=0.3, process_cpu=0.3, write_rate=41e6)
READING = Activity(window=3.0, read_rate=2e6)
WRITER_THREAD = Activity(window=3.0, process_cpu=0.6)  # the main thread joins a writer thread
POLLING = Activity(window=3.0, main_cpu=0.001, process_cpu=0.002)  # while True: sleep(0.05)
STARVED = Activity(window=3.0, main_cpu=0.003, process_cpu=0.004, main_wait=0.97)  # SCHED_IDLE
SYNCHRONIZE = (  # a CUDA wait: it spins, so its CPU time says nothing
    Frame("synchronize", f"{SITE}/torch/cuda/__init__.py", 985),
    Frame("evaluate", TRAIN, 70),
    Frame("main", TRAIN, 104),
)


def culprit_is(activity: Activity = IDLE, moved: bool = False, frames: tuple[Frame, ...] =
               DATA_STALL, stalled_for: float = 42.0, **rank1: Any) -> JobSnapshot:
    """The data pipeline stall, with this evidence about rank 1."""
    job = data_pipeline(stacks={0: DDP_BACKWARD, 1: frames, 2: DDP_BACKWARD, 3: DDP_BACKWARD},
                        activity=activity, **rank1)
    stacks = dict(job.stacks)
    stacks[1] = dataclasses.replace(stacks[1], samples=3, moved=moved)
    return dataclasses.replace(job, stacks=stacks, stalled_for=stalled_for, busy_timeout=600.0)


def everyone(activity: Activity) -> JobSnapshot:
    """Every rank outside any collective, past its last step, with the same evidence."""
    ranks = [rank(r, done(57, 2.0), activity=activity) for r in range(4)]
    job = snapshot(*ranks, stacks={r: DATA_STALL for r in range(4)})
    return dataclasses.replace(job, busy_timeout=600.0)


TIERS = {
    "no CPU, no I/O, the same frame: hung": (culprit_is(), Kind.MISSING_RANKS),
    "no activity measured yet: judged as before, hung": (
        culprit_is(Activity()), Kind.MISSING_RANKS),
    "a polling loop, 0.1% of a core: hung": (culprit_is(POLLING), Kind.MISSING_RANKS),
    "computing: busy": (culprit_is(COMPUTING), Kind.RANK_BUSY),
    "computing in a window that began before the stall: not evidence, hung": (
        culprit_is(COMPUTING, stalled_for=2.5), Kind.MISSING_RANKS),
    "writing a checkpoint, in D state: busy, not wedged": (
        culprit_is(WRITING, proc_state="D"), Kind.RANK_BUSY),
    "reading at 2 MB/s inside one function: busy": (culprit_is(READING), Kind.RANK_BUSY),
    "a background thread works while the main one waits for it: busy": (
        culprit_is(WRITER_THREAD), Kind.RANK_BUSY),
    "its Python stack moves between samples: busy": (culprit_is(moved=True), Kind.RANK_BUSY),
    "runnable yet starved of CPU by other work on the node: busy": (
        culprit_is(STARVED), Kind.RANK_BUSY),
    "caught runnable once, yet it waited for no CPU: hung": (
        culprit_is(POLLING, proc_state="R"), Kind.MISSING_RANKS),
    "waiting for a CPU while spinning in a CUDA synchronize: hung": (
        culprit_is(STARVED, frames=SYNCHRONIZE), Kind.MISSING_RANKS),
    "D state and nothing else: wedged": (culprit_is(proc_state="D"), Kind.RANK_WEDGED),
    "no Python for 30 s and no CPU: wedged": (
        culprit_is(heartbeat_age=30.0), Kind.RANK_WEDGED),
    "no Python for 30 s while native code computes: busy": (
        culprit_is(COMPUTING, heartbeat_age=30.0), Kind.RANK_BUSY),
    "stopped, whatever its counters said before: wedged": (
        culprit_is(COMPUTING, proc_state="T"), Kind.RANK_WEDGED),
    "spinning in a CUDA synchronize: hung": (
        culprit_is(COMPUTING, frames=SYNCHRONIZE), Kind.MISSING_RANKS),
    "in a CUDA synchronize while its GPU works: busy": (
        culprit_is(dataclasses.replace(COMPUTING, gpu_util=87.0), frames=SYNCHRONIZE),
        Kind.RANK_BUSY),
    "busy past the busy timeout: hung": (
        culprit_is(COMPUTING, stalled_for=600.0), Kind.MISSING_RANKS),
    "every rank computing outside collectives: a long phase": (everyone(COMPUTING), None),
    "every rank idle outside collectives: hung": (everyone(IDLE), Kind.RANK_STALLED),
}


@pytest.mark.parametrize(("job", "expected"), TIERS.values(), ids=TIERS.keys())
def test_evidence_decides_the_tier(job: JobSnapshot, expected: Kind | None) -> None:
    verdict = decide(job)
    assert (verdict.kind if verdict else None) == expected
    if verdict is not None and verdict.kind is not Kind.RANK_STALLED:
        assert verdict.culprit_ranks == (1,)
        assert verdict.waiting_ranks == (0, 2, 3)
        assert verdict.severity == ("notice" if expected is Kind.RANK_BUSY else "hang")


def test_a_busy_rank_is_named_with_what_it_does_and_who_waits() -> None:
    verdict = decide(culprit_is(WRITING, stalled_for=25.0))
    assert verdict is not None
    assert verdict.summary == (
        "rank 1 busy in read_sample_from_storage at train.py:42 for 25 s, writing 41.0 MB/s, "
        "using 30% of a core; ranks 0,2,3 wait in all_reduce #57 on group 0 (world) since "
        "12:00:03")
    assert verdict.collective is not None and verdict.collective.seq == 57


def test_past_the_busy_timeout_the_hang_says_it_was_busy() -> None:
    verdict = decide(culprit_is(COMPUTING, stalled_for=601.0))
    assert verdict is not None and verdict.kind is Kind.MISSING_RANKS
    assert verdict.summary.endswith(
        "; rank 1 kept working (using 100% of a core) for 601 s, past the busy timeout")


def test_a_stall_no_rule_explains_is_still_reported() -> None:
    """Both ranks wait, each in a collective the other is not behind in: rank 0 in group A's #5,
    which rank 1 shows completed, rank 1 in group B's #4. No rule names anyone."""
    pair = (0, 1)
    job = snapshot(
        rank(0, entered(5, 2.0, group="A", ranks=pair), done(3, 1.0, group="B", ranks=pair)),
        rank(1, done(5, 2.0, group="A", ranks=pair), entered(4, 3.0, group="B", ranks=pair)))
    verdict = decide(job)
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
        Kind.RANK_STALLED, (), (0, 1))
    assert verdict.summary.startswith("no rank made progress for 42 s and the evidence names "
                                      "no culprit; rank 0 waits in all_reduce #5 on group A")


def test_the_watchdogs_own_wrapper_is_never_the_top_of_a_stack() -> None:
    """FSDP2's waiters sit in the hook's Work.wait wrapper, inside the all-gather."""
    wait = Frame("patch_work_wait.<locals>.wait",
                 str(Path(watchdog.__file__).parent / "hook" / "patches" / "works.py"), 58)
    gather = Frame("all_gather_single", f"{SITE}/torch/distributed/distributed_c10d.py", 4386)
    groups = stack_groups({0: RankStack(0, 1, (wait, gather, Frame("forward", TRAIN, 20)))})
    assert groups == [{"ranks": [0], "top": "all_gather_single (distributed_c10d.py:4386)"}]


def writer_in_barrier(activity: Activity, stalled_for: float) -> JobSnapshot:
    """Rank 0, after writing a checkpoint, in the barrier #43 its peers wait in: by its stack,
    not yet by its hook."""
    job = snapshot(rank(0, done(42, 2.0), activity=activity),
                   *(rank(r, entered(43, 3.0, op="barrier"), activity=IDLE) for r in (1, 2, 3)),
                   stacks={r: BARRIER for r in range(4)})
    return dataclasses.replace(job, stalled_for=stalled_for, busy_timeout=600.0)


@pytest.mark.parametrize(("activity", "expected"), [(WRITING, Kind.RANK_BUSY),
                                                    (IDLE, Kind.RANK_STALLED)])
def test_no_rule_names_the_writer_whose_stack_is_in_the_barrier_before_its_hook_says_so(
        activity: Activity, expected: Kind) -> None:
    """Rank 0 wrote a checkpoint while its peers waited in barrier #43, and entered it just
    before the look: its stack is in the barrier, its hook not yet. No rule names a culprit;
    a rank that was writing all the while says the job works (a CI run killed this healthy
    job), one that shows nothing leaves the stall unexplained, a hang."""
    verdict = decide(writer_in_barrier(activity, stalled_for=11.0))
    assert verdict is not None and verdict.kind is expected
    if expected is Kind.RANK_BUSY:
        assert (verdict.culprit_ranks, verdict.waiting_ranks) == ((0,), (1, 2, 3))
        assert verdict.summary.startswith("rank 0 busy in save_checkpoint at train.py:58 for "
                                          "11 s, writing 41.0 MB/s")
    else:
        assert verdict.culprit_ranks == () and verdict.waiting_ranks == (0, 1, 2, 3)


def test_past_the_busy_timeout_a_stall_no_rule_explains_names_who_kept_working() -> None:
    verdict = decide(writer_in_barrier(WRITING, stalled_for=601.0))
    assert verdict is not None and verdict.kind is Kind.RANK_STALLED
    assert (verdict.culprit_ranks, verdict.waiting_ranks) == ((0,), (1, 2, 3))
    assert verdict.summary.startswith(
        "the job made no progress for 601 s; no rule names a culprit, and rank 0 works while "
        "the others wait; ranks 1-3 wait in barrier #43")
    assert verdict.summary.endswith(
        "; rank 0 kept working (writing 41.0 MB/s) for 601 s, past the busy timeout")


def test_a_node_that_stopped_reporting_is_named_whatever_its_ranks_last_showed() -> None:
    """Ranks 2,3 of node-b last showed work, and then their agent went: their state is unknown,
    so the node is named, not them (what they showed is stale)."""
    job = snapshot(*(rank(r, entered(57, 3.0), activity=IDLE) for r in (0, 1)),
                   *(rank(r, done(56, 2.0), activity=WRITING) for r in (2, 3)),
                   stacks={0: DDP_BACKWARD, 1: DDP_BACKWARD})
    job = dataclasses.replace(job, unreachable_nodes=("node-b",), busy_timeout=600.0,
                              rank_nodes={0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"})
    verdict = decide(job)
    assert verdict is not None and verdict.kind is Kind.NODE_UNREACHABLE
