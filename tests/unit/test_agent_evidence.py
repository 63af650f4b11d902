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


def _reading(pid: int) -> activity.Reading:
    return activity.read(pid, time.time(), procfs.read_stat(pid) or pytest.fail(f"no {pid}"))


def test_a_thread_starved_of_cpu_is_seen_waiting_and_a_sleeping_one_is_not() -> None:
    """At SCHED_IDLE beside a busy loop on its core, a loop waits runnable nearly all the time:
    the state letter catches that only now and then; schedstat's run delay measures it."""
    hog, starved = _spinning("--other"), _spinning("--idle")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)  # past the interpreters' start
        before = [_reading(p.pid) for p in (starved, sleeper)]
        time.sleep(1.5)
        after = [_reading(p.pid) for p in (starved, sleeper)]
        waits = [activity.rates(b, a).main_wait for b, a in zip(before, after, strict=True)]
        assert waits[0] >= 0.5 and waits[1] < 0.05, waits
    finally:
        for proc in (hog, starved, sleeper):
            proc.kill()
            proc.wait()


def test_without_the_main_threads_counter_the_process_bounds_it() -> None:
    rates = activity.rates(reading(0.0, None, 1.0, None), reading(5.0, None, 3.0, None))
    assert (rates.main_cpu, rates.process_cpu, rates.write_rate) == (0.4, 0.4, 0.0)


def test_the_window_keeps_the_last_few_seconds() -> None:
    window = activity.ActivityWindow()
    for second in range(20):  # one report a second, a core busy the first 10 s, then idle
        cpu = float(min(second, 10))
        latest = window.add(reading(float(second), cpu, cpu, (0, 0)))
    assert latest.window == activity.WINDOW_S
    assert latest.main_cpu == 0.0
    assert window.add(reading(19.5, 10.0, 10.0, (0, 0))).window == activity.WINDOW_S + 0.5


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
