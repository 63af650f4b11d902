"""A pid is checked against the start time the agent read when it first saw the process, right
before any signal (`watchdog run --on-hang kill` and `restart`) or stack dump: with real
processes, one whose pid names a process of another start time (as a reused pid does) is
neither signalled nor dumped."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from agent import procfs
from agent.stacks import dump_stack
from agent.worker import Worker
from watchdog.beacon import Identity
from watchdog.supervise.embedded import signal_worker


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session of its own, as torchrun starts its workers."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def worker(pid: int, start_ticks: int) -> Worker:
    return Worker(Identity("job", 0, 0, 1, "node-a", pid, time.time()), start_ticks)


def start_ticks(pid: int) -> int:
    stat = procfs.read_stat(pid)
    assert stat is not None
    return stat.start_ticks


def test_a_pid_names_the_process_of_one_start_time(sleeper: subprocess.Popen[bytes]) -> None:
    ticks = start_ticks(sleeper.pid)
    stat = procfs.read_stat_of(sleeper.pid, ticks)
    assert stat is not None and stat.pid == sleeper.pid and not stat.gone
    assert procfs.read_stat_of(sleeper.pid, ticks + 1) is None  # started at another time
    sleeper.kill()
    sleeper.wait()
    assert procfs.read_stat_of(sleeper.pid, ticks) is None  # gone


def test_a_pid_that_names_another_process_is_not_signalled(
        sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture) -> None:
    ticks = start_ticks(sleeper.pid)
    with caplog.at_level(logging.INFO):
        signal_worker(worker(sleeper.pid, ticks + 1), signal.SIGKILL)
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(0.5)
    assert f"not signalling pid {sleeper.pid}: rank 0's process has exited" in caplog.text
    signal_worker(worker(sleeper.pid, ticks), signal.SIGKILL)
    assert sleeper.wait(30) == -signal.SIGKILL


def test_a_pid_that_names_another_process_is_not_dumped(
        sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture) -> None:
    ticks = start_ticks(sleeper.pid)
    with caplog.at_level(logging.INFO):
        stack = asyncio.run(dump_stack(0, sleeper.pid, ticks + 1))
    assert stack.error == f"process {sleeper.pid} has exited" and not stack.frames
    assert f"not dumping pid {sleeper.pid}" in caplog.text
