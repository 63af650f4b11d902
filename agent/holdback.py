"""Whether a node report tells the coordinator anything it could not assume (agent).

A large job spans many nodes, and their reports are most of a coordinator's work: at 16,384
ranks, 2,048 messages a second, each costing it more than the ranks it carries. Most say only
that every rank of the node moved on. Such a report is held back, once: a large job's node
reports at least every second interval, and at once when anything else changed, above all a
rank that did not progress, so a stall is heard as soon as ever. A small job's reports are all
sent: its few nodes are all the coordinator hears of its progress, and holding one back would
double the pace it measures, and the job's stall threshold with it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from watchdog.model import NodeReport, RankState

# From this many ranks a job spans enough nodes, each reporting at its own moment, that the
# coordinator still hears it progress every interval.
QUIET_WORLD = 256
MAX_HELD = 1  # reports held back in a row


@dataclass
class Holdback:
    """The report last sent, against which the next one is judged."""

    sent: NodeReport | None = None
    held: int = 0

    def worth_sending(self, report: NodeReport, delivered: bool) -> bool:
        """Whether to send `report`; `delivered`: the last report sent left the agent (a held
        report is only safe where the coordinator has the one before it)."""
        if (delivered and self.held < MAX_HELD and self.sent is not None
                and only_progress(self.sent, report)):
            self.held += 1
            return False
        self.sent, self.held = report, 0
        return True


def only_progress(before: NodeReport, now: NodeReport) -> bool:
    """Whether `now` says no more than `before` did, but that each of its ranks progressed."""
    return (len(now.ranks) == len(before.ranks) > 0
            and all(_moved_on(old, new) for old, new in zip(before.ranks, now.ranks, strict=True)))


def _moved_on(before: RankState, now: RankState) -> bool:
    return (now.world_size >= QUIET_WORLD and now.hooked and now.alive and not now.phase
            and not now.setup and now.events > before.events
            and _standing(now) == _standing(before))


def _standing(state: RankState) -> Hashable:
    """What a rank's report says besides its progress, its process's state and activity: a
    change to any of it is news (a checks' finding, a group joined, an exit)."""
    return (state.job_id, state.rank, state.local_rank, state.world_size, state.host, state.pid,
            state.attempt, state.phase, state.setup, state.exit_code, state.exit_reason,
            state.clean_exit, state.evidence, tuple((g.group, g.ranks) for g in state.groups))
