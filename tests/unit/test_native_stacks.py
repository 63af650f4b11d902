"""Stacks taken with `py-spy --native`: real dumps of 3-rank gloo jobs (tests/fixtures/stacks),
in which native frames sit above and below the Python ones: ranks in an all-reduce, and ranks
in DDP's constructor while a peer never wrapped its model."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent import procfs, stacks
from agent.stacks import dump_stacks, main_thread_frames
from tests.helpers.builders import DATA_STALL, FORWARD_LOOP, WORLD, done, rank, snapshot, unhooked
from watchdog.coordinator.evidence import collective_frame, distributed_frame
from watchdog.coordinator.incident import rank_table, stack_groups
from watchdog.coordinator.verdict import decide
from watchdog.frames import MEMO_FRAMES, by_identity, python_frames, stuck_frame
from watchdog.model import Frame, Kind, RankStack

CHECKOUT = str(Path(__file__).resolve().parents[2])
STACKS = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
# tests/fixtures/stacks/README.md: ranks 0 (and 1, 3 alike) wait in DDP's shape check; rank 2
# loads its pretrained weights before wrapping its model, for ever
PRE_DDP = {0: "ddp_init_rank0", 1: "ddp_init_rank0", 2: "pre_ddp_rank2", 3: "ddp_init_rank0"}
WORKER_QUEUE = (  # a rank waiting for its DataLoader workers' next batch
    Frame("wait", "/usr/lib/python3.11/threading.py", 331),
    Frame("get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
    Frame("_try_get_data", "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py",
          1275),
    Frame("_next_data", "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py",
          1456),
    Frame("main", "/home/ml/train.py", 104),
)
DCP_WRITE = (  # torch.distributed.checkpoint.save writing its shard: a phase, not a wait
    Frame("_write_files_from_queue",
          "/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/filesystem.py", 472),
    Frame("_write_data",
          "/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/filesystem.py", 712),
    Frame("save_checkpoint", "/home/ml/train.py", 58),
)
EVALUATING = (  # an evaluation's DDP forward, sampled in the Python DDP calls on every forward
    Frame("notify_join_context",
          "/venv/lib/python3.11/site-packages/torch/distributed/algorithms/join.py", 287),
    Frame("_pre_forward", "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py",
          1554),
    Frame("forward", "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", 1657),
    Frame("evaluate_for", "/home/ml/train.py", 128),
)


def dump(name: str) -> tuple[Frame, ...]:
    """The main thread of a fixture dump, in this checkout (see the fixtures' README)."""
    text = (STACKS / f"py_spy_native_{name}.json").read_text().replace("{CHECKOUT}", CHECKOUT)
    return main_thread_frames(json.loads(text), pid=0)


def frames(rank: int) -> tuple[Frame, ...]:
    return dump(f"rank{rank}")


def test_dumps_hold_native_frames_around_the_python_ones() -> None:
    waiting = frames(0)
    assert [f.file.rsplit("/", 1)[-1] for f in waiting[:4]] == [
        "libc.so.6", "libc.so.6", "libstdc++.so.6.0.30", "libtorch_cpu.so"]
    assert [(f.function, f.line) for f in python_frames(waiting)] == [
        ("all_reduce", 3252), ("_exception_logger.<locals>.wrapper", 83), ("train_step", 7),
        ("<module>", 8)]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_wait_under_six_native_frames_is_still_in_its_collective(rank: int) -> None:
    found = collective_frame(frames(rank))
    assert found is not None and (found.function, found.line) == ("all_reduce", 3252)


def test_the_sleeping_rank_is_stuck_in_its_own_code_not_in_libc() -> None:
    assert collective_frame(frames(2)) is None
    stuck = stuck_frame(frames(2))
    assert stuck is not None and (stuck.function, stuck.line) == ("train_step", 6)
    assert stuck.file.endswith("waiter.py")


def test_native_addresses_do_not_split_stack_groups() -> None:
    assert frames(0) != frames(1)  # ASLR: the same code at other addresses
    groups = stack_groups({rank: RankStack(rank, 100 + rank, frames(rank)) for rank in range(3)})
    assert [group["ranks"] for group in groups] == [[2], [0, 1]]
    assert [group["top"] for group in groups] == ["train_step (waiter.py:6)",
                                                  "all_reduce (distributed_c10d.py:3252)"]


@pytest.mark.parametrize(("name", "function"), [
    ("ddp_init_rank0", "_verify_param_shape_across_processes"),
    ("ddp_broadcast_hooked", "_sync_module_states"),  # the hook's wrapper sits between
])
def test_a_rank_in_ddps_constructor_waits_in_torch_distributed(name: str, function: str) -> None:
    found = collective_frame(dump(name))
    assert found is not None and found.function == function
    assert found.file.endswith("torch/distributed/utils.py")


def test_a_rank_in_its_own_code_is_not_waiting_whatever_called_it() -> None:
    """Under DDP's forward, in a DataLoader, or before DDP: user frames are innermost. A
    distributed checkpoint writing its files waits for no one either."""
    for stack in (dump("pre_ddp_rank2"), FORWARD_LOOP, DATA_STALL, WORKER_QUEUE, DCP_WRITE,
                  EVALUATING):
        assert distributed_frame(stack) is None and collective_frame(stack) is None
    stuck = stuck_frame(dump("pre_ddp_rank2"))
    assert stuck is not None and (stuck.function, stuck.file) == (
        "load_pretrained", f"{CHECKOUT}/watchdog/demo/train.py")


def test_stacks_alone_name_the_rank_that_never_reached_ddp() -> None:
    """No hook anywhere: the three in DDP's constructor wait, the fourth is the culprit."""
    job = snapshot(*(unhooked(r) for r in WORLD), stacks={r: dump(PRE_DDP[r]) for r in WORLD})
    verdict = decide(job)
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
        Kind.MISSING_RANKS, (2,), (0, 1, 3))
    assert verdict.summary.startswith("rank 2 (stuck in load_pretrained at train.py:130) never "
                                      "reached the collective that ranks 0,1,3 wait in "
                                      "(_verify_param_shape_across_processes called at train.py:"
                                      ), verdict.summary


def test_hooked_ranks_that_cannot_record_ddps_constructor_leave_the_stacks_to_decide() -> None:
    """A torch whose DDP helpers the hook does not know: every rank at #0, none pending. The
    minority outside torch.distributed is named, the others wait (not 'rank 0 stuck in
    <module>')."""
    job = snapshot(*(rank(r, done(0, 0.0, op=""), steps=0) for r in WORLD),
                   stacks={r: dump(PRE_DDP[r]) for r in WORLD})
    verdict = decide(job)
    assert verdict is not None
    assert (verdict.kind, verdict.culprit_ranks, verdict.waiting_ranks) == (
        Kind.RANK_STALLED, (2,), (0, 1, 3))
    assert verdict.summary.startswith("rank 2 (stuck in load_pretrained at train.py:130) made no "
                                      "progress for 42 s outside any collective; ranks 0,1,3 "
                                      "wait in a collective (_verify_param_shape_across_processes"
                                      ), verdict.summary
    rows = rank_table(job)["ranks"]
    assert [row["state"] for row in rows] == ["WAITING"] * 2 + ["STALLED", "WAITING"]


def test_what_is_read_from_a_stack_is_kept_for_that_tuple_of_frames_only() -> None:
    """Ranks alike share one tuple of frames: each question is asked of it once. A list may
    change after it was asked about, so nothing is kept for one."""
    asked: list[object] = []

    @by_identity
    def depth(frames: Sequence[Frame]) -> int:
        asked.append(frames)
        return len(frames)

    shared = tuple(DATA_STALL)
    assert [depth(shared) for _ in range(3)] == [len(DATA_STALL)] * 3 and asked == [shared]
    equal = tuple(list(DATA_STALL))
    assert depth(equal) == len(DATA_STALL) and len(asked) == 2
    listed = list(DATA_STALL)
    depth(listed)
    listed.append(Frame("main", "train.py", 9))
    assert depth(listed) == len(DATA_STALL) + 1


def test_answers_are_kept_for_stacks_of_at_most_a_budget_of_frames() -> None:
    """Stacks asked about are held while kept: a stream of distinct deep ones never holds more
    than MEMO_FRAMES frames."""
    asked: list[object] = []

    @by_identity
    def depth(frames: Sequence[Frame]) -> int:
        asked.append(frames)
        return len(frames)

    deep = [tuple(Frame(f"f{n}", "train.py", i) for i in range(500)) for n in range(40)]
    assert [depth(frames) for frames in deep] == [500] * 40
    assert depth(deep[-1]) == 500 and len(asked) == 40  # the newest still kept
    assert depth(deep[0]) == 500 and len(asked) == 41  # the oldest let go: 40 x 500 > budget
    assert MEMO_FRAMES < 40 * 500


def test_native_frames_come_within_the_requests_budget_and_python_ones_past_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real py-spy dumps of a sleeping interpreter: within the request's budget its stack holds
    native frames; with the budget spent (a turn that came too late), Python frames alone."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); "
                             "time.sleep(120)"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"\n"
        stat = procfs.read_stat(proc.pid)
        assert stat is not None
        target = [(0, proc.pid, stat.start_ticks, None)]
        [within] = asyncio.run(dump_stacks(target, native=True))
        assert any(f.native for f in within.frames), within
        assert any(f.function == "<module>" for f in within.frames), within
        monkeypatch.setattr(stacks, "NATIVE_BUDGET_S", stacks.MIN_NATIVE_S / 2)
        [past] = asyncio.run(dump_stacks(target, native=True))
        assert past.frames and not any(f.native for f in past.frames), past
    finally:
        proc.kill()
        proc.wait()
