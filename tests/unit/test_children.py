"""The children of a rank: when its main thread waits on one, which processes are its children,
what a DataLoader worker's dump says (agent side, real processes where it matters)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agent import children
from agent.stacks import sample_child
from tests.helpers.builders import SITE, TRAIN
from watchdog.model import Frame

STDLIB = "/usr/lib/python3.11"
LOADER = f"{SITE}/torch/utils/data/dataloader.py"
WAITS_IN_THE_DATA_QUEUE = (  # py-spy's view of a rank whose DataLoader waits for a worker
    Frame("_PollLikeSelector.select", f"{STDLIB}/selectors.py", 415),
    Frame("wait", f"{STDLIB}/multiprocessing/connection.py", 947),
    Frame("Connection._poll", f"{STDLIB}/multiprocessing/connection.py", 440),
    Frame("Queue.get", f"{STDLIB}/multiprocessing/queues.py", 113),
    Frame("_MultiProcessingDataLoaderIter._try_get_data", LOADER, 1291),
    Frame("_MultiProcessingDataLoaderIter._next_data", LOADER, 1505),
    Frame("train", TRAIN, 61),
)
PINNED = (  # with pin_memory, the main thread waits on the pinning thread's queue
    Frame("wait", f"{STDLIB}/threading.py", 331),
    Frame("get", f"{STDLIB}/queue.py", 180),
    Frame("futex_wait", "libc.so.6", 0),
    Frame("_MultiProcessingDataLoaderIter._try_get_data", LOADER, 1291),
    Frame("train", TRAIN, 61),
)
SUBPROCESS = (Frame("Popen._wait", f"{STDLIB}/subprocess.py", 2011),
              Frame("Popen.wait", f"{STDLIB}/subprocess.py", 1264), Frame("prepare", TRAIN, 9))
SPAWNED_RANK_IN_ITS_OWN_CODE = (  # multiprocessing frames outermost: not a wait
    Frame("read_shard", TRAIN, 16),
    Frame("BaseProcess.run", f"{STDLIB}/multiprocessing/process.py", 108),
    Frame("BaseProcess._bootstrap", f"{STDLIB}/multiprocessing/process.py", 314),
)
IN_A_COLLECTIVE = (Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2950),
                   Frame("train", TRAIN, 70))
WORKER_LOOP = Frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 374)
FORKED_WORKER = (  # a worker's stack goes on with what its parent's was when it forked
    Frame("read_record", TRAIN, 87),
    WORKER_LOOP,
    Frame("BaseProcess.run", f"{STDLIB}/multiprocessing/process.py", 108),
    Frame("BaseProcess._bootstrap", f"{STDLIB}/multiprocessing/process.py", 314),
    Frame("Popen._launch", f"{STDLIB}/multiprocessing/popen_fork.py", 71),
    Frame("main", TRAIN, 315),
)


@pytest.mark.parametrize(("frames", "waits"), [
    (WAITS_IN_THE_DATA_QUEUE, True), (PINNED, True), (SUBPROCESS, True),
    (SPAWNED_RANK_IN_ITS_OWN_CODE, False), (IN_A_COLLECTIVE, False), ((), False),
    ((Frame("__next__", LOADER, 733), Frame("train", TRAIN, 61)), False),
])
def test_a_rank_waits_on_a_child_only_where_its_innermost_call_does(
        frames: tuple[Frame, ...], waits: bool) -> None:
    assert children.waits_on_child(frames) is waits


def test_a_forked_worker_keeps_its_own_frames_only() -> None:
    own = children.own_frames(FORKED_WORKER)
    assert [f.function for f in own] == ["read_record", "_worker_loop", "BaseProcess.run",
                                         "BaseProcess._bootstrap"]
    assert children.is_dataloader_worker(own)
    assert not children.is_dataloader_worker(IN_A_COLLECTIVE)


def raw_worker_loop(worker_id: str) -> list[dict[str, object]]:
    return [{"name": "read_record", "filename": TRAIN, "locals": [
                {"name": "worker_id", "repr": "9"}]},  # another function's local: not it
            {"name": "_worker_loop", "filename": WORKER_LOOP.file, "locals": [
                {"name": "dataset_kind", "repr": "0"}, {"name": "worker_id", "repr": worker_id}]}]


@pytest.mark.parametrize(("text", "expected"), [("1", 1), ("12", 12), ("'1'", None),
                                                ("-1", None), ("9" * 40, None)])
def test_the_worker_id_is_the_worker_loops_own_argument(text: str, expected: int | None) -> None:
    assert children.worker_id(raw_worker_loop(text)) == expected
    assert children.worker_id([{"name": "main", "filename": TRAIN}, "junk"]) is None


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


def test_the_children_of_a_process_that_run_as_its_user(
        sleeper: subprocess.Popen[bytes]) -> None:
    assert sleeper.pid in children.child_pids(os.getpid(), os.getuid())
    assert children.child_pids(os.getpid(), os.getuid() + 1) == []  # never another user's
    assert children.child_pids(sleeper.pid, os.getuid()) == []


def test_a_child_no_longer_of_the_ranks_user_when_dumped_is_left_out(
        sleeper: subprocess.Popen[bytes]) -> None:
    """Its uids are read again before each dump: listed as the rank's user's, it may have
    exec'd a setuid program since (same pid, same start time)."""
    assert asyncio.run(sample_child(sleeper.pid, samples=1, uid=os.getuid() + 1)) is None


def test_a_child_gone_before_its_stack_is_taken_is_left_out(
        sleeper: subprocess.Popen[bytes]) -> None:
    sleeper.kill()
    sleeper.wait()
    assert asyncio.run(sample_child(sleeper.pid, samples=2)) is None


def test_a_child_that_runs_short_passes_of_its_own_shows_their_cpu() -> None:
    """A compiler driver (gcc) does its work in the passes it runs and waits for (cc1plus, as):
    its own CPU is nil, theirs is counted, running or reaped."""
    spin = "import time\nend = time.process_time() + 0.15\nwhile time.process_time() < end: pass"
    driver = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys\n"
        f"while True: subprocess.run([sys.executable, '-S', '-c', {spin!r}])")])
    try:
        sampled = asyncio.run(sample_child(driver.pid, samples=3))
    finally:
        driver.kill()
        driver.wait()
    assert sampled is not None
    assert sampled.cpu >= 0.1, sampled  # the 10% of a core that counts as work
