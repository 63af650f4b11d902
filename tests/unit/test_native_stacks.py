"""Stacks taken with `py-spy --native`: real dumps of a 3-rank gloo job (tests/fixtures/stacks),
in which native frames sit above and below the Python ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.stacks import main_thread_frames
from watchdog.coordinator.evidence import collective_frame, python_frames, stuck_frame
from watchdog.coordinator.incident import stack_groups
from watchdog.model import Frame, RankStack

STACKS = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def frames(rank: int) -> tuple[Frame, ...]:
    dump = json.loads((STACKS / f"py_spy_native_rank{rank}.json").read_text())
    return main_thread_frames(dump, pid=0)


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
