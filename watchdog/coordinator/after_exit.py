"""After a rank's exit (coordinator process; pure: time is an argument): is its job still hung
a threshold later?

An exit is the launcher's to handle: torchrun stops the other workers itself and restarts or
fails the job, so nothing ends a job because a rank exited (a RANK_EXITED incident). What is
left hung is another matter: a rank that exits 0 early while its peers wait for it forever
(torchrun waits for every worker). The job is still hung when, the job's evidence threshold
after the exit (the warm-up aside; never less than the floor, the launcher's time to act; from
when the process was known gone, after its exit handlers), its live ranks all wait (in a
collective or a set-up call, by their hooks), the job made no progress for that long, and no
other rank ended except by finishing cleanly (a rank the launcher ended, or a peer that failed,
which the launcher then handles).
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from watchdog.coordinator.evidence import finished_cleanly
from watchdog.coordinator.jobs import JobView
from watchdog.schema import Incident
from watchdog.text import ranks_text


class AfterExit(enum.Enum):
    NOT_YET = "not yet"
    NEVER = "never"  # its peers went on, every rank left, or the launcher is ending them


@dataclass(frozen=True)
class StillHung:
    """`waiting`, every live rank of the job, made no progress in the `waited` seconds since
    the exit that `incident` names."""

    incident: Incident
    waited: float
    waiting: tuple[int, ...]

    def text(self, wait: str = "still wait") -> str:
        """'ranks 0,1,3 still wait 10 s after rank 2 exited, and the launcher did not end
        them'."""
        return (f"{ranks_text(self.waiting)} {wait} {self.waited:.0f} s after "
                f"{ranks_text(self.incident['culprit_ranks'])} exited, and the launcher did "
                "not end them")


def after_exit(job: JobView, exit_incident: Incident,
               now: float) -> StillHung | AfterExit:
    """Whether `job`, whose ranks' exit `exit_incident` told, is still hung as of `now`."""
    culprits = exit_incident["culprit_ranks"]
    # Timed from the process's end, not the hook's sys.exit: the launcher acts only after it.
    exited_at = min((at for r in culprits if (at := job.gone_at(r)) is not None), default=None)
    if exited_at is None or job.live == 0 or _others_ended(job, culprits):
        return AfterExit.NEVER
    # The launcher gets the floor at least, whatever --stall-timeout says: on a loaded node
    # its peers' own errors (a closed connection) take seconds to end them.
    threshold = max(job.evidence_threshold(), job.policy.floor)
    quiet = job.tracker.stalled_for(now)
    if now - quiet > exited_at + threshold:
        return AfterExit.NEVER  # progress a threshold past the exit: they did not need it
    if not job.all_waiting or min(now - exited_at, quiet) < threshold:
        return AfterExit.NOT_YET
    waiting = tuple(sorted(state.rank for state in job.ranks.values() if state.alive))
    return StillHung(exit_incident, now - exited_at, waiting)


def _others_ended(job: JobView, culprits: Collection[int]) -> bool:
    """Whether a rank besides the culprits ended, other than by finishing cleanly: the
    launcher is ending the attempt (or will, for a peer that failed)."""
    if len(job.ranks) - job.live == len(culprits):  # the common case, without a walk
        return False
    return any(not state.alive and state.rank not in culprits and not finished_cleanly(state)
               for state in job.ranks.values())
