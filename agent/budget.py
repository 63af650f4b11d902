"""How often the agent lets stacks of one job, and of one process, be taken (agent process).

Every py-spy dump pauses the ranks it attaches to, and the stack requests come from a
coordinator: a faulty or hostile one must not be able to keep a job paused. A job's stacks are
taken at most once every MIN_INTERVAL_S; a request sooner is answered with an error per rank.
The coordinator asks less often than that on its own. A process is dumped at most once every
MIN_INTERVAL_S too, whichever job asks: one process holding beacons of many jobs (its user's
own, all verified) would otherwise be paused once a second for each.
"""

from __future__ import annotations

from collections.abc import Hashable

MIN_INTERVAL_S = 1.0
_FORGET_AFTER_S = 60.0
_MAX_KEPT = 1024  # jobs, and processes


class StackBudget:
    def __init__(self, min_interval: float = MIN_INTERVAL_S) -> None:
        self.min_interval = min_interval
        self._jobs: dict[Hashable, float] = {}  # job id -> when its stacks were last taken
        self._processes: dict[Hashable, float] = {}  # pid -> when it was last dumped

    def refuse(self, job_id: str, now: float) -> str:
        """Why stacks of `job_id` may not be taken at `now` (monotonic seconds); "" when they
        may, which counts as taking them."""
        last = _take(self._jobs, job_id, now, self.min_interval)
        return "" if last is None else (
            f"not attaching: stacks of this job were taken {now - last:.2f}s ago (at most once "
            f"every {self.min_interval:g}s)")

    def refuse_process(self, pid: int, now: float) -> str:
        """Why process `pid` may not be dumped at `now`, for whichever job; "" when it may,
        which counts as dumping it."""
        last = _take(self._processes, pid, now, self.min_interval)
        return "" if last is None else (
            f"not attaching: this process was dumped {now - last:.2f}s ago, for another job "
            f"of the beacons it holds (at most once every {self.min_interval:g}s)")


def _take(taken: dict[Hashable, float], key: Hashable, now: float,
          min_interval: float) -> float | None:
    """When `key` was last taken, if within `min_interval` of `now`; else None, and it is
    taken now."""
    last = taken.get(key)
    if last is not None and now - last < min_interval:
        return last
    if len(taken) >= _MAX_KEPT:  # ever new keys must not grow this
        recent = sorted(taken.items(), key=lambda item: item[1])[-_MAX_KEPT // 2:]
        taken.clear()
        taken.update((k, at) for k, at in recent if now - at < _FORGET_AFTER_S)
    taken[key] = now
    return None
