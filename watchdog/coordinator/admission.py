"""Which reported ranks a job's view trusts (coordinator process).

Job ids are chosen by users, and a user can run processes that claim to be ranks of another
user's job: a rank of world size 1,000,000 would keep that job from ever counting all its
ranks, and a second "rank 2" from another node would overwrite the real one. So a rank whose
world size differs from the job's, or that claims a rank a live process on another node already
holds, is *flagged*: listed in `watchdog status`, never part of the view that is judged.

Until the job has started (every rank reported), the world size claimed by the most distinct
ranks is the job's: a forged claim seen first gives way to the real job as its ranks arrive.
Once started, the job's shape is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from watchdog import schema
from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.stall import StallPolicy
from watchdog.model import RankState

MAX_FLAGGED_PER_JOB = 64
FLAG_TTL_S = 30.0  # a flagged rank no longer reported for this long is forgotten


@dataclass
class Flagged:
    node: str
    state: RankState
    reason: str
    seen_at: float

    def to_json(self) -> schema.Flagged:
        return {"rank": self.state.rank, "node": self.node, "host": self.state.host,
                "pid": self.state.pid, "world_size": self.state.world_size,
                "reason": self.reason}


class Admission:
    """The flagged ranks of every job, and the rule that decides them."""

    def __init__(self, policy: StallPolicy) -> None:
        self.policy = policy
        self.flagged: dict[str, dict[tuple[str, int, int], Flagged]] = {}

    def admit(self, job: JobView, node: str, state: RankState, now: float) -> bool:
        """Whether `state` belongs in `job`'s view; a state that does not is flagged."""
        reason = _conflict(job, node, state)
        if not reason:
            return True
        flags = self.flagged.setdefault(job.job_id, {})
        flags[(node, state.pid, state.rank)] = Flagged(node, state, reason, now)
        if len(flags) > MAX_FLAGGED_PER_JOB:
            del flags[min(flags, key=lambda key: flags[key].seen_at)]
        return False

    def reconsider(self, job: JobView, now: float) -> JobView:
        """`job`, or a new view of the same job when, before it started, the ranks it flagged
        agree on a world size more of them claim than its view holds."""
        flags = self.flagged.get(job.job_id)
        if not flags:
            return job
        for key in [k for k, f in flags.items() if now - f.seen_at > FLAG_TTL_S]:
            del flags[key]
        if job.started or not flags:
            return job
        by_world: dict[int, dict[int, Flagged]] = {}
        for flag in flags.values():
            by_world.setdefault(flag.state.world_size, {})[flag.state.rank] = flag
        _world, claims = max(by_world.items(), key=lambda item: (len(item[1]), -item[0]))
        if len(claims) <= len(job.ranks):
            return job
        rebuilt = JobView(job.job_id, self.policy)
        for flag in claims.values():
            rebuilt.update(flag.node, flag.state)
            del flags[(flag.node, flag.state.pid, flag.state.rank)]
        for rank, state in job.ranks.items():
            self.admit(rebuilt, job.nodes[rank], state, now)
        return rebuilt

    def forget(self, job_id: str) -> None:
        self.flagged.pop(job_id, None)

    def to_json(self, job_id: str) -> list[schema.Flagged]:
        flags = self.flagged.get(job_id, {})
        return [flags[key].to_json() for key in sorted(flags, key=lambda k: (k[2], k[0], k[1]))]


def _conflict(job: JobView, node: str, state: RankState) -> str:
    if job.ranks and state.world_size != job.world_size:
        return f"claims world size {state.world_size}; the job's is {job.world_size}"
    held = job.ranks.get(state.rank)
    if held is not None and held.alive and job.nodes[state.rank] != node:
        return (f"rank {state.rank} is already pid {held.pid} on node "
                f"{job.nodes[state.rank]}")
    return ""
