"""Stragglers: the ranks the others persistently wait for (coordinator process; pure).

Each rank's hook adds up, by its own clock, the seconds it spends inside collectives (a
blocking collective from entry to return, DDP's backward, which ends waiting for the gradients'
all-reduce). In data-parallel training every rank waits for the slowest at each collective, so
the slowest waits least: per step, the others wait about what it costs them. Only durations
are compared, each measured on one rank's own clock and divided by that rank's own steps, so
the clocks of different nodes never meet.

Each rank's (steps, seconds waited) is kept for WINDOW_S, a sample whenever its steps changed;
an interval between two samples gives a rate, seconds waited per step. A rank is a straggler
when even its upper quartile rate stays below the lower quartile of the ranks that wait, by at
least MIN_LOST_S and MIN_SHARE of a step: so in most of its intervals, not in one slow step nor
in a periodic phase (rank 0's logging or evaluation every few steps, a RANK_BUSY matter when
long), which leaves most intervals alike. A phase shorter than an interval falls in every one,
so each rank also sends the sum of its steps' waits squared: a deficit d spread over a share f
of the steps adds d^2 (1 - f) / f to the variance of the waiters' waits per step, so
f = d^2 / (d^2 + that excess), and the deficit must be spread over at least MIN_SPREAD of the
steps. It must hold for HOLD_S before it is called, and ends once it failed for HOLD_S. A
rank's first SKIP_STEPS steps (compiling, warming caches, the first batch) are never compared.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from watchdog.model import RankState

WINDOW_S = 20.0  # seconds of each rank's samples compared
MIN_INTERVALS = 6  # intervals with steps in a rank's window before it is compared
SKIP_STEPS = 5  # a rank's first steps: compiling, warming caches, its first batch
HOLD_S = 10.0  # how long the gap must hold before it is called, and fail before it ends
MIN_LOST_S = 0.05  # seconds lost per step, at least...
MIN_SHARE = 0.1  # ...and this share of a step
MIN_SPREAD = 0.5  # ...spread over at least this share of the steps, not a phase in a few


@dataclass(frozen=True)
class Slowest:
    """The rank that waits least, and what it costs the job per step, whether or not it is
    called a straggler."""

    rank: int
    lost: float  # seconds per step the others wait for it (their median rate less its)
    step: float  # seconds per step, by its own clock
    stragglers: tuple[int, ...]  # the ranks that hold the job back persistently; may be ()

    @property
    def share(self) -> float:
        return self.lost / self.step if self.step > 0 else 0.0


@dataclass(frozen=True)
class _Rates:
    p25: float
    median: float
    p75: float
    step: float
    mean: float  # seconds waited per step over the window
    variance: float  # of the seconds waited per step over the window


def _spread(rank: _Rates, waiters: list[_Rates]) -> float:
    """The share of the steps the rank's deficit is spread over: 1 when the others wait for
    it alike at every step, 1/k when they wait k times as long in one step of k."""
    deficit = statistics.median(w.mean for w in waiters) - rank.mean
    if deficit <= 0:
        return 0.0
    excess = max(0.0, statistics.median(w.variance for w in waiters) - rank.variance)
    return deficit * deficit / (deficit * deficit + excess)


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    low, middle, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, middle, high


@dataclass
class _Samples:
    """One rank's (received, steps, waited, waited squared), oldest first."""

    pid: int
    kept: deque[tuple[float, int, float, float]] = field(default_factory=deque)

    def add(self, at: float, steps: int, waited: float, squared: float) -> None:
        if self.kept and steps <= self.kept[-1][1]:
            return
        self.kept.append((at, steps, waited, squared))
        while self.kept and at - self.kept[0][0] > WINDOW_S:
            self.kept.popleft()

    def rates(self) -> _Rates | None:
        kept = self.kept
        if len(kept) <= MIN_INTERVALS:
            return None
        waits, steps = [], []
        for (at0, steps0, waited0, _), (at1, steps1, waited1, _) in zip(kept, list(kept)[1:],
                                                                        strict=False):
            # a wall clock stepped back inside the rank shows as a negative wait: none
            waits.append(max(0.0, waited1 - waited0) / (steps1 - steps0))
            steps.append((at1 - at0) / (steps1 - steps0))
        low, middle, high = _quartiles(waits)
        (_, steps0, waited0, squared0), (_, steps1, waited1, squared1) = kept[0], kept[-1]
        mean = max(0.0, waited1 - waited0) / (steps1 - steps0)
        variance = max(0.0, (squared1 - squared0) / (steps1 - steps0) - mean * mean)
        return _Rates(low, middle, high, statistics.median(steps), mean, variance)


@dataclass
class StragglerTracker:
    """Each live rank's samples, and whether the job's stragglers are called (`evaluate`)."""

    samples: dict[int, _Samples] = field(default_factory=dict)
    called: tuple[int, ...] = ()  # the stragglers called and not ended
    _since: float | None = None  # when the gap (or, once called, its absence) began
    _candidates: tuple[int, ...] = ()

    def observe(self, state: RankState, received: float) -> None:
        """Take a rank's report; a rank that exited, or a new process for it, starts over."""
        if not state.hooked or not state.alive or state.steps < SKIP_STEPS:
            self.samples.pop(state.rank, None)
            return
        kept = self.samples.get(state.rank)
        if kept is None or kept.pid != state.pid:
            kept = self.samples[state.rank] = _Samples(state.pid)
        kept.add(received, state.steps, state.waited, state.waited_sq)

    def slowest(self, world_size: int) -> Slowest | None:
        """The rank waiting least, once every rank of the world has a window to compare."""
        rates = {rank: r for rank, s in self.samples.items() if (r := s.rates()) is not None}
        if world_size < 2 or len(rates) < world_size:
            return None
        by_wait = sorted(rates, key=lambda rank: rates[rank].median)
        waiters = by_wait[len(by_wait) // 2:]  # the upper half: the ranks that wait
        reference = statistics.median(rates[r].p25 for r in waiters)
        typical = statistics.median(rates[r].median for r in waiters)
        first = rates[by_wait[0]]
        margin = max(MIN_LOST_S, MIN_SHARE * first.step)
        stragglers = tuple(sorted(r for r in by_wait[:len(by_wait) // 2]
                                  if rates[r].p75 <= reference - margin
                                  and _spread(rates[r], [rates[w] for w in waiters])
                                  >= MIN_SPREAD))
        return Slowest(by_wait[0], max(0.0, typical - first.median), first.step, stragglers)

    def evaluate(self, slowest: Slowest | None, now: float) -> tuple[int, ...] | None:
        """The stragglers to call now (they held the job back for HOLD_S), () when the ones
        called have caught up (for HOLD_S), else None: nothing to say."""
        found = slowest.stragglers if slowest is not None else ()
        if bool(found) == bool(self.called):
            self._since, self._candidates = None, ()
            return None
        if self._since is None or (found and found != self._candidates):
            self._since, self._candidates = now, found
        if now - self._since < HOLD_S:
            return None
        self._since, self._candidates, self.called = None, (), found
        return found

    def forget(self, ranks: Iterable[int]) -> None:
        for rank in ranks:
            self.samples.pop(rank, None)
