"""torch.compile is work, not a hang: real py-spy dumps of ranks compiling with inductor under
DDP (tests/fixtures/stacks, "torch.compile"), judged as the coordinator judges a stalled job.

Every rank entered DDP's all-reduce #11 at its forward by its hook's count, and compiles inside
that forward: one runs the C++ compiler, the others wait for the cache lock it holds. Their
counters say "all in a collective"; their stacks say nobody is in one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from agent.stacks import main_thread_frames
from tests.helpers.builders import (
    BARRIER,
    DATA_STALL,
    TRAIN,
    done,
    entered,
    rank,
    snapshot,
    world_ref,
)
from watchdog.coordinator.evidence import compiling, progress_sign, waits_for_file_lock
from watchdog.coordinator.verdict import decide
from watchdog.model import Activity, Frame, Kind, RankStack

STACKS = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def dump(name: str) -> tuple[Frame, ...]:
    return main_thread_frames(json.loads((STACKS / f"py_spy_{name}.json").read_text()), 0)


CC_WAIT = dump("compile_cc_wait")  # in Popen.communicate, inductor's C++ compiler running
CACHE_LOCK = dump("compile_cache_lock")  # in filelock's poll for inductor's cache lock
RUNNING_FORWARD = dump("compiled_forward")  # a compiled model running its kernels
RUNNING_BACKWARD = dump("compiled_backward")
IDLE = Activity(window=3.0)  # the agent's readings: no CPU, no I/O over 3 s
WRITING = Activity(window=3.0, main_cpu=0.3, write_rate=40e6)
FILE_LOCK = (  # a rank's own code waiting for a lock another rank holds (filelock, by hand)
    Frame("LockAcquisition._poll_until_acquired",
          "/venv/lib/python3.11/site-packages/filelock/_core/_acquire.py", 177),
    Frame("BaseFileLock.acquire", "/venv/lib/python3.11/site-packages/filelock/_core/_lock.py",
          195),
    Frame("prepare_dataset", TRAIN, 31),
    Frame("<module>", TRAIN, 130),
)


def in_forward(*stacks: tuple[Frame, ...], activity: Activity = IDLE):  # type: ignore[no-untyped-def]
    """Four ranks inside DDP's forward of step 11 (all-reduce #11 pending by their hooks),
    quiet for 42 s, with these stacks."""
    return snapshot(*(rank(r, entered(11, 3.0 + r / 10), steps=10, activity=activity)
                      for r in range(4)),
                    stacks=dict(enumerate(stacks)))


def test_compile_frames_are_told_from_compiled_code_running() -> None:
    assert compiling(CC_WAIT) and compiling(CACHE_LOCK)
    assert not compiling(RUNNING_FORWARD) and not compiling(RUNNING_BACKWARD)
    assert not compiling(DATA_STALL)
    assert waits_for_file_lock(CACHE_LOCK) and waits_for_file_lock(FILE_LOCK)
    assert not waits_for_file_lock(CC_WAIT) and not waits_for_file_lock(DATA_STALL)


def test_a_rank_compiling_shows_progress_whatever_its_innermost_frames_wait_for() -> None:
    idle = rank(1, entered(11, 3.0), activity=IDLE)
    for frames in (CC_WAIT, CACHE_LOCK):
        assert progress_sign(idle, RankStack(1, 4243, frames), 42.0).startswith(
            "compiling (torch.compile)")
    assert progress_sign(idle, RankStack(1, 4243, RUNNING_FORWARD), 42.0) == ""


def test_every_rank_compiling_in_its_forward_is_a_phase_not_a_communication_fault() -> None:
    """The issue's incident said ALL_IN_COLLECTIVE ("a communication fault") here."""
    assert decide(in_forward(CACHE_LOCK, CC_WAIT, CACHE_LOCK, CACHE_LOCK)) is None


def test_ranks_whose_stacks_wait_in_no_collective_are_stalled_not_in_a_fault() -> None:
    """Counters and stacks disagree and nobody works: the ranks are named, no fault claimed."""
    verdict = decide(in_forward(DATA_STALL, DATA_STALL, DATA_STALL, DATA_STALL))
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
        Kind.RANK_STALLED, (0, 1, 2, 3), ())
    assert "communication fault" not in verdict.summary
    assert verdict.summary.endswith(
        "outside any collective (the hooks count all_reduce #11 on group 0 (world) as entered, "
        "but no stack waits in a collective)")


def test_a_rank_stuck_while_its_peers_compile_is_still_named() -> None:
    """Rank 2 blocked in its data while the others compile: the hang stands, after a look."""
    snap = in_forward(CACHE_LOCK, CC_WAIT, DATA_STALL, CACHE_LOCK)
    verdict = decide(snap)
    assert verdict is not None and verdict.kind is Kind.RANK_BUSY  # until the busy timeout
    assert verdict.culprit_ranks == (0, 1, 3)
    assert "rank 2 made no progress outside any collective" in verdict.summary
    late = decide(dataclasses.replace(snap, stalled_for=700.0, busy_timeout=600.0))
    assert late is not None and late.kind is Kind.RANK_STALLED


def test_without_stacks_the_counters_still_say_all_in() -> None:
    verdict = decide(in_forward())
    assert verdict is not None
    assert (verdict.kind, verdict.collective) == (Kind.ALL_IN_COLLECTIVE, world_ref(11))


def test_a_rank_waiting_for_a_file_lock_a_busy_peer_holds_is_no_culprit() -> None:
    """Rank 0 writes under a lock rank 1 waits for; ranks 2 and 3 wait in a barrier."""
    snap = snapshot(rank(0, done(20, 2.0), activity=WRITING),
                    rank(1, done(20, 2.1), activity=IDLE),
                    rank(2, entered(21, 3.0, "barrier"), activity=IDLE),
                    rank(3, entered(21, 3.1, "barrier"), activity=IDLE),
                    stacks={0: BARRIER[2:], 1: FILE_LOCK, 2: BARRIER, 3: BARRIER})
    verdict = decide(snap)
    assert verdict is not None and verdict.kind is Kind.RANK_BUSY
    assert verdict.culprit_ranks == (0,)
    assert "rank 1 waits for a file lock" in verdict.summary
    # Nobody works: the lock's holder is not a peer of the job, and rank 1 is named.
    idle = decide(dataclasses.replace(snap, ranks=(dataclasses.replace(snap.ranks[0],
                                                                       activity=IDLE),
                                                   *snap.ranks[1:])))
    assert idle is not None and idle.kind is Kind.MISSING_RANKS
    assert 1 in idle.culprit_ranks


def test_the_hook_says_a_rank_compiles_where_no_stack_was_taken_and_a_stack_has_the_last_word(
        ) -> None:
    told = rank(1, entered(11, 3.0), activity=IDLE, compile_age=12.0)
    assert progress_sign(told, None, 42.0) == "compiling (torch.compile)"
    # The hook missed the end of a compile (torch._dynamo.reset() drops its callbacks): the
    # stack, blocked in the rank's own data, says otherwise.
    assert progress_sign(told, RankStack(1, 4243, DATA_STALL), 42.0) == ""
    assert progress_sign(told, RankStack(1, 4243, CACHE_LOCK), 42.0).startswith("compiling")
