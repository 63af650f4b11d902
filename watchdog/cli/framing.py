"""What `watchdog run` says around the job (CLI process): the threshold it watches with, what
the user can do after a hang it leaves running, and the line that closes the run: how the job
ended, the incidents seen and where they are stored. Once it ended a hung job, that closing line
repeats the verdict, below whatever the launcher printed as it died (torchrun's traceback).

An unwatched job must not look like a healthy one: when no rank ever reported, the closing line
says that nothing was watched; a job that failed with no incident is pointed at its own output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watchdog.coordinator.jobs import is_hang
from watchdog.coordinator.stall import StallPolicy
from watchdog.errors import ExitCode
from watchdog.text import printable

NOT_WATCHED = ("a process reports once it is a torch.distributed rank (torchrun's RANK, or "
               "init_process_group) with the hook in it; `watchdog doctor` checks the set-up")

FAILED_EARLY = ("the cause is in its output above (`watchdog explain LOG` reads a saved "
                "one)")


@dataclass(frozen=True)
class RunEnd:
    """How a watched run ended."""

    code: int  # what `watchdog run` exits with
    lasted: float  # seconds the job ran
    incidents: Sequence[Mapping[str, Any]]  # every incident printed during the run
    db_path: str
    watched: bool  # some rank of the job reported
    distributed: bool = False  # ...and got as far as torch.distributed
    interrupted: bool = False  # the user's Ctrl-C (or SIGTERM) went to the job
    killed_for: Mapping[str, Any] | None = None  # the hang --on-hang kill ended the job for


def threshold_text(policy: StallPolicy) -> str:
    """'hung after 3 s without progress (--stall-timeout)': the threshold in force."""
    if policy.fixed is not None:
        return f"hung after {policy.fixed:g} s without progress (--stall-timeout)"
    return (f"hung after {policy.floor:g} s without progress ({policy.k:g} x the job's pace if "
            f"longer; up to {policy.warmup:g} s at start-up)")


def next_steps_text(incident: Mapping[str, Any], db_path: str) -> str:
    """After a hang that `--on-hang report` leaves running: where it is and what to do."""
    ident = printable(str(incident["id"]))
    return (f"watchdog: hang incident {ident} is stored in {db_path}. The job is still hung: "
            "Ctrl-C ends it (--on-hang kill would have ended it);\n"
            f"watchdog:   `watchdog incidents show {ident} --html report.html` writes it as a "
            "page to attach to a ticket")


def ended_text(end: RunEnd) -> str:
    """The run's last lines: how the job ended, and what the watchdog saw of it."""
    lasted = f"after {end.lasted:.0f} s"
    if end.killed_for is not None:
        first = (f"watchdog: ended the hung job {lasted} (exit code {end.code}): "
                 f"{printable(str(end.killed_for['summary']))}")
    elif end.interrupted:
        first = f"watchdog: the job ended {lasted}, interrupted (exit code {end.code})"
    else:
        first = f"watchdog: the job ended {lasted} with exit code {end.code}"
    failed = end.code not in (0, ExitCode.INTERRUPTED) and not end.incidents
    if failed and not end.distributed:
        return f"{first}, before any rank of it reached torch.distributed: {FAILED_EARLY}"
    if failed:
        return f"{first}; no incident: {FAILED_EARLY}"
    if not end.watched:
        return f"{first}; no rank of it reported, so nothing was watched: {NOT_WATCHED}"
    return f"{first}; {_incidents_text(end.incidents, end.db_path)}"


def _incidents_text(incidents: Sequence[Mapping[str, Any]], db_path: str) -> str:
    if not incidents:
        return "no incident"
    hangs = sum(1 for incident in incidents if is_hang(incident))
    resumed = sum(1 for incident in incidents if "resumed_at" in incident)
    counted = f"{len(incidents)} incident{'s' if len(incidents) > 1 else ''}"
    contradicted = f", {resumed} of them contradicted by the job" if resumed else ""
    kinds = f" ({hangs} hang{'s' if hangs > 1 else ''}{contradicted})" if hangs else ""
    latest = printable(str(incidents[-1]["id"]))
    return (f"{counted}{kinds}, stored in {db_path}: `watchdog incidents show {latest}` shows "
            "the latest")
