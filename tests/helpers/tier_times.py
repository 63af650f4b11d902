"""The time and CPU each tier took, printed at the end of a run (a plugin tests/conftest.py
registers in the process that reports: xdist's controller, or the only one), and the tests that
used the most CPU: on two cores the suite is bound by CPU, not by its tests' waits."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MOST_CPU = 15  # tests listed by the CPU they used


def cpu_seconds() -> float:
    """CPU of this process and of every child it has reaped (theirs include their own reaped
    children: torchrun's ranks, a daemon's py-spy)."""
    return sum(usage.ru_utime + usage.ru_stime for usage in (
        resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


class CpuPerPhase:
    """Registered where tests run: each report carries the CPU used since the one before (a
    test's setup, call or teardown, daemons a fixture stops included), which xdist sends on."""

    def __init__(self) -> None:
        self._mark = cpu_seconds()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self) -> Generator[None, Any, None]:
        outcome = yield
        now = cpu_seconds()
        outcome.get_result().cpu_s = now - self._mark
        self._mark = now


@dataclass
class _Tier:
    tests: int = 0
    seconds: float = 0.0  # of test time: setups, calls and teardowns, summed over the workers
    cpu: float = 0.0  # CPU-seconds of the workers and their children in those
    first: float = float("inf")  # when its first test began
    last: float = 0.0  # and its last one ended


class TierTimes:
    def __init__(self, tier_of: Callable[[Path], str | None], rootpath: Path) -> None:
        self._tier_of = tier_of
        self._root = rootpath
        self._tiers: dict[str, _Tier] = {}
        self._cpu_of: dict[str, float] = {}
        self._began = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = self._tier_of(self._root / report.nodeid.split("::")[0]) or "other"
        spent = self._tiers.setdefault(tier, _Tier())
        cpu = float(getattr(report, "cpu_s", 0.0))
        spent.seconds += report.duration
        spent.cpu += cpu
        spent.first = min(spent.first, report.start)
        spent.last = max(spent.last, report.stop)
        spent.tests += report.when == "teardown"  # every test has one, whatever happened
        self._cpu_of[report.nodeid] = self._cpu_of.get(report.nodeid, 0.0) + cpu

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self._tiers:
            return
        write = terminalreporter.write_line
        terminalreporter.section("time per tier")
        write(f"{'tier':<12}{'tests':>7}{'test time':>12}{'CPU':>8}{'wall':>9}  (wall: its first "
              "test's start to its last one's end)")
        for name, tier in sorted(self._tiers.items(), key=lambda item: item[1].first):
            write(f"{name:<12}{tier.tests:>7}{tier.seconds:>11.0f}s{tier.cpu:>7.0f}s"
                  f"{tier.last - tier.first:>8.0f}s")
        tiers = self._tiers.values()
        write(f"{'whole run':<12}{sum(t.tests for t in tiers):>7}"
              f"{sum(t.seconds for t in tiers):>11.0f}s{sum(t.cpu for t in tiers):>7.0f}s"
              f"{time.time() - self._began:>8.0f}s")
        terminalreporter.section(f"most CPU, {MOST_CPU} tests")
        for nodeid, cpu in sorted(self._cpu_of.items(), key=lambda item: -item[1])[:MOST_CPU]:
            write(f"{cpu:7.1f}s  {nodeid}")
