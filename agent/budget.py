"""How often the agent lets stacks of one job be taken (agent process).

Every py-spy dump pauses the ranks it attaches to, and the stack requests come from a
coordinator: a faulty or hostile one must not be able to keep a job paused. A job's stacks are
taken at most once every MIN_INTERVAL_S; a request sooner is answered with an error per rank.
The coordinator asks less often than that on its own.
"""

from __future__ import annotations

MIN_INTERVAL_S = 1.0
_FORGET_AFTER_S = 60.0
_MAX_JOBS = 1024


class StackBudget:
    def __init__(self, min_interval: float = MIN_INTERVAL_S) -> None:
        self.min_interval = min_interval
        self._last: dict[str, float] = {}  # job id -> when its stacks were last taken

    def refuse(self, job_id: str, now: float) -> str:
        """Why stacks of `job_id` may not be taken at `now` (monotonic seconds); "" when they
        may, which counts as taking them."""
        last = self._last.get(job_id)
        if last is not None and now - last < self.min_interval:
            return (f"not attaching: stacks of this job were taken {now - last:.2f}s ago (at "
                    f"most once every {self.min_interval:g}s)")
        if len(self._last) >= _MAX_JOBS:  # requests for ever new job ids must not grow this
            recent = sorted(self._last.items(), key=lambda item: item[1])[-_MAX_JOBS // 2:]
            self._last = {job: at for job, at in recent if now - at < _FORGET_AFTER_S}
        self._last[job_id] = now
        return ""
