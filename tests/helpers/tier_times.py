"""The time each tier took, printed at the end of a run (a plugin tests/conftest.py registers in
the process that reports: xdist's controller, or the only one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class _Tier:
    tests: int = 0
    seconds: float = 0.0  # of test time: setups, calls and teardowns, summed over the workers
    first: float = float("inf")  # when its first test began
    last: float = 0.0  # and its last one ended


class TierTimes:
    def __init__(self, tier_of: Callable[[Path], str | None], rootpath: Path) -> None:
        self._tier_of = tier_of
        self._root = rootpath
        self._tiers: dict[str, _Tier] = {}
        self._began = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = self._tier_of(self._root / report.nodeid.split("::")[0]) or "other"
        spent = self._tiers.setdefault(tier, _Tier())
        spent.seconds += report.duration
        spent.first = min(spent.first, report.start)
        spent.last = max(spent.last, report.stop)
        spent.tests += report.when == "teardown"  # every test has one, whatever happened

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self._tiers:
            return
        write = terminalreporter.write_line
        terminalreporter.section("time per tier")
        write(f"{'tier':<12}{'tests':>7}{'test time':>12}{'wall':>9}  (wall: its first test's "
              "start to its last one's end)")
        for name, tier in sorted(self._tiers.items(), key=lambda item: item[1].first):
            write(f"{name:<12}{tier.tests:>7}{tier.seconds:>11.0f}s{tier.last - tier.first:>8.0f}s")
        write(f"{'whole run':<12}{sum(t.tests for t in self._tiers.values()):>7}"
              f"{sum(t.seconds for t in self._tiers.values()):>11.0f}s"
              f"{time.time() - self._began:>8.0f}s")
