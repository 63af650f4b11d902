"""The agent's progress evidence, from real readings: CPU and I/O rates over a window, this
very process's /proc counters, stack samples that move or do not, and no GPU here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import activity, procfs
from agent.gpu import GpuSampler
from agent.stacks import moved
from watchdog.model import NO_ACTIVITY, Activity, Frame


def reading(at: float, main: float | None, process: float, io: tuple[int, int] | None,
            waited: float | None = None) -> activity.Reading:
    return activity.Reading(at, main, waited, process, io)


def test_rates_between_two_readings() -> None:
    old, new = reading(10.0, 1.0, 1.5, (1000, 0)), reading(12.0, 2.9, 3.5, (1000, 82_000_000))
    assert activity.rates(old, new) == Activity(2.0, 0.95, 1.0, 0.0, 41_000_000.0)
    assert activity.rates(new, new) is NO_ACTIVITY
    starved = activity.rates(reading(10.0, 1.0, 1.0, None, 4.0),
                             reading(12.0, 1.02, 1.0, None, 5.9))
    assert (round(starved.main_cpu, 3), round(starved.main_wait, 3)) == (0.01, 0.95)


def _spinning(policy: str) -> subprocess.Popen[bytes]:
    """A busy loop on CPU 0, at `policy` (chrt's --other or --idle)."""
    return subprocess.Popen(["taskset", "-c", "0", "chrt", policy, "0", sys.executable, "-c",
                             "while True: pass"])


def _windows_of(pids: list[int], seconds: float) -> list[Activity]:
    """The activity of each of `pids` over the same `seconds`, read as an agent reads it, 5
    times a second."""
    windows = {pid: activity.ActivityWindow() for pid in pids}
    latest = dict.fromkeys(pids, NO_ACTIVITY)
    for _ in range(int(seconds * 5) + 1):
        for pid, window in windows.items():
            stat = procfs.read_stat(pid) or pytest.fail(f"no {pid}")
            latest[pid] = window.add(activity.read(pid, time.time(), stat))
        time.sleep(0.2)
    return [latest[pid] for pid in pids]


def test_a_thread_starved_of_cpu_is_seen_waiting_and_a_sleeping_one_is_not() -> None:
    """At SCHED_IDLE beside a busy loop on its core, a loop waits runnable nearly all the time
    (the kernel counts a wait in the run delay only once the thread runs again, so the readings
    that found it runnable count too); a sleeping process waits for nothing."""
    hog, starved = _spinning("--other"), _spinning("--idle")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)  # past the interpreters' start
        waits = [a.main_wait for a in _windows_of([starved.pid, sleeper.pid], 1.6)]
        assert waits[0] >= 0.5 and waits[1] < 0.05, waits
    finally:
        for proc in (hog, starved, sleeper):
            proc.kill()
            proc.wait()


def test_a_hung_thread_caught_runnable_once_is_not_waiting() -> None:
    window = activity.ActivityWindow()
    states = [False, True, False, False]  # a poll loop's wake-up, caught once in four readings
    for second, runnable in enumerate(states):
        latest = window.add(activity.Reading(float(second), 0.001 * second, 0.0, 0.001 * second,
                                             None, runnable))
    assert latest.main_wait == pytest.approx(0.249)  # a quarter of the readings, less its CPU
    starved = activity.ActivityWindow()
    for second in range(4):
        latest = starved.add(activity.Reading(float(second), 0.0, 0.0, 0.0, None, True))
    assert latest.main_wait == 1.0


def test_the_window_starts_at_the_ranks_last_progress_once_half_a_second_has_passed() -> None:
    """Readings every 0.25 s: the rank trained (idle main thread: it waits in collectives) and
    progressed at 10.0, then computes a whole core (an evaluation). Within the 3 s window the
    rates would mix both; since its progress they are the evaluation's alone."""
    window = activity.ActivityWindow()
    cpu = 0.0
    for tick in range(48):  # 0 to 11.75 s
        at = tick / 4
        cpu += 0.25 if at > 10.0 else 0.0
        latest = window.add(activity.Reading(at, cpu, 0.0, cpu, None), progress_at=10.0)
        if at == 10.25:
            assert latest.window == pytest.approx(3.0)  # too short since: the whole window
    assert latest.window == pytest.approx(1.75)
    assert latest.main_cpu == pytest.approx(1.0)
    # The same readings without a later progress: the whole window, a mix.
    mixed = activity.ActivityWindow()
    for tick in range(48):
        at = tick / 4
        latest = mixed.add(activity.Reading(at, min(at - 10.0, 1.75) if at > 10 else 0.0, 0.0,
                                            0.0, None), progress_at=2.0)
    assert latest.window == pytest.approx(3.0)
    assert latest.main_cpu < 0.7


def test_this_process_counters_move_when_it_works(tmp_path: Path) -> None:
    pid = os.getpid()
    began = time.time()
    before = activity.read(pid, began, procfs.read_stat(pid) or pytest.fail("no stat"))
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    (tmp_path / "out").write_bytes(os.urandom(1 << 20))
    ended = time.time()
    after = activity.read(pid, ended, procfs.read_stat(pid) or pytest.fail("no stat"))
    rates = activity.rates(before, after)
    # The CPU seconds the rates stand for, not the rates: on a loaded machine the 0.3 s of CPU
    # takes longer, and a rate falls with it (the tick counts in 10 ms steps: 0.25 s).
    assert rates.main_cpu * (ended - began) >= 0.25
    assert rates.process_cpu * (ended - began) >= 0.25
    assert before.io is not None and after.io is not None
    assert after.io[1] - before.io[1] >= 1 << 20


def test_a_vanished_process_has_no_counters() -> None:
    gone = 2**22 + 12345
    assert procfs.main_thread_sched_ns(gone) is None
    assert procfs.io_bytes(gone) is None


@pytest.mark.parametrize("package", ["installed", "missing"])
def test_without_a_gpu_there_is_no_gpu_evidence_and_no_error(
        package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has NVML's Python package (the test extra) but no driver and no GPU."""
    if package == "missing":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import` finds uninstalled
    else:
        import pynvml

        with pytest.raises(pynvml.NVMLError):
            pynvml.nvmlInit()  # the machine really has no GPU: else this test proves nothing
    sampler = GpuSampler()
    assert not sampler.available
    assert sampler.utilization() == {}


def stack_at(line: int, native: bool = False) -> tuple[Frame, ...]:
    frames = (Frame("spin", "/home/ml/train.py", line), Frame("main", "/home/ml/train.py", 9))
    return ((Frame("futex_wait", "libc.so.6", 0),) if native else ()) + frames


def test_a_stack_moved_when_its_innermost_python_frame_differs() -> None:
    assert not moved([stack_at(40), stack_at(40), stack_at(40, native=True)])
    assert moved([stack_at(40), stack_at(41), stack_at(40)])
