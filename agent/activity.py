"""What each rank's process did lately, from /proc (and NVML where there is a GPU): the evidence
that tells a busy rank from a hung one, read on every report without stopping the process.

Counters are cumulative; a rank's activity is their rate between the newest reading and the
oldest one within WINDOW_S, so one GC pause or fsync burst does not decide it. The window is
short enough to fit inside a stall of 3 s (a common fixed --stall-timeout): the coordinator
ignores rates whose window reaches back before the stall began. Where the rank progressed
within the window, the window starts at its progress instead (at least MIN_WINDOW_S of
readings): what the rank does in a quiet spell of a second or two is then known too, which
tells a short evaluation on every rank (a phase, not the job's pace) from training.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, replace

from agent import procfs
from watchdog.model import NO_ACTIVITY, Activity

WINDOW_S = 3.0
MIN_WINDOW_S = 0.5  # readings since the rank's last progress, before they are its activity
RUNNABLE_READINGS = 3  # in the window, before the share found runnable says anything
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Reading:
    at: float
    main_cpu: float | None  # seconds
    main_wait: float | None  # seconds the main thread waited, runnable, for a CPU
    process_cpu: float  # seconds
    io: tuple[int, int] | None  # bytes read, written
    runnable: bool = False  # its main thread was runnable (state R) at the reading


def read(pid: int, at: float, stat: procfs.ProcStat, proc: str = "/proc") -> Reading:
    """The counters of one live process, as of `at`; `stat` is its stat line read just now."""
    sched = procfs.main_thread_sched_ns(pid, proc)
    return Reading(at, None if sched is None else sched[0] / 1e9,
                   None if sched is None else sched[1] / 1e9,
                   stat.cpu_ticks / _TICKS_PER_S, procfs.io_bytes(pid, proc), stat.state == "R")


class ActivityWindow:
    """The recent readings of one process."""

    __slots__ = ("_readings",)

    def __init__(self) -> None:
        self._readings: deque[Reading] = deque()

    def add(self, reading: Reading, gpu_util: float | None = None,
            progress_at: float = 0.0) -> Activity:
        """Record a reading; the activity over the window that ends with it, or since
        `progress_at` (the rank's last progress, by its hook) where that is later and long
        enough."""
        readings = self._readings
        readings.append(reading)
        while len(readings) > 2 and reading.at - readings[1].at >= WINDOW_S:
            readings.popleft()
        window = list(readings)
        if progress_at > readings[0].at:
            since = [r for r in readings if r.at >= progress_at]
            if len(since) > 1 and reading.at - since[0].at >= MIN_WINDOW_S:
                window = since
        work = rates(window[0], reading, gpu_util)
        if len(window) < RUNNABLE_READINGS:
            return work
        # The kernel adds a wait to the run delay only once the thread runs again: a thread
        # starved outright shows none. Runnable at most readings while it barely ran, it waited.
        runnable = sum(r.runnable for r in window) / len(window) - work.main_cpu
        return replace(work, main_wait=min(1.0, max(work.main_wait, runnable)))


def rates(old: Reading, new: Reading, gpu_util: float | None = None) -> Activity:
    """The activity between two readings of one process; NO_ACTIVITY when they span no time."""
    span = new.at - old.at
    if span <= 0:
        return NO_ACTIVITY if gpu_util is None else Activity(gpu_util=gpu_util)
    main = (new.main_cpu - old.main_cpu if new.main_cpu is not None and old.main_cpu is not None
            else new.process_cpu - old.process_cpu)  # no schedstat: the process bounds it
    read, written = ((new.io[0] - old.io[0], new.io[1] - old.io[1])
                     if new.io is not None and old.io is not None else (0, 0))
    waited = (new.main_wait - old.main_wait
              if new.main_wait is not None and old.main_wait is not None else 0.0)
    return Activity(span, max(0.0, main / span),
                    max(0.0, (new.process_cpu - old.process_cpu) / span),
                    max(0.0, read / span), max(0.0, written / span), gpu_util,
                    min(1.0, max(0.0, waited / span)))
