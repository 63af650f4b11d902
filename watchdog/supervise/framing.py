"""What `watchdog run` says around the job (CLI process): the threshold it watches with, what
the user can do after a hang it leaves running, what it ends and why, and the line that closes
the run: how the job ended (each attempt torchrun ran, where it restarted), the incidents seen
and where they are stored. Once it ended a job, that closing line repeats why, below whatever
the launcher printed as it died (torchrun's traceback).

"Hung" is said of hangs only: a rank's exit is the launcher's to handle, and the watchdog ends
a job for one only when its peers still wait a threshold later (`StillHung`); when the launcher
ended the job, the closing line says that the watchdog ended nothing. An unwatched job must not
look like a healthy one: when no rank ever reported, the closing line says that nothing was
watched; a job that failed with no incident is pointed at its own output.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from watchdog.coordinator.after_exit import StillHung
from watchdog.coordinator.database import Database, database_of
from watchdog.coordinator.persist import Unstored
from watchdog.coordinator.stall import StallPolicy
from watchdog.errors import ExitCode, WatchdogError
from watchdog.model import Kind
from watchdog.schema import ExitReason, Incident, is_hang
from watchdog.text import printable, ranks_text

NOT_WATCHED = ("a process reports once it is a torch.distributed rank (torchrun's RANK, or "
               "init_process_group) with the hook in it; `watchdog doctor` checks the set-up")

FAILED_EARLY = ("the cause is in its output above (`watchdog explain LOG` reads a saved "
                "one)")


@dataclass(frozen=True)
class Ended:
    """What `--on-hang` ended (`action`: kill, the job; restart, the attempt's workers) and for
    what: a hang `incident`, or an exit `incident` whose peers still waited (`still`)."""

    action: str
    incident: Incident
    still: StillHung | None = None


@dataclass(frozen=True)
class RunEnd:
    """How a watched run ended."""

    code: int  # what `watchdog run` exits with
    lasted: float  # seconds the job ran
    incidents: Sequence[Incident]  # every incident printed during the run
    db: str  # where they are stored, as shown: a path, or a URL without its password
    watched: bool  # some rank of the job reported
    distributed: bool = False  # ...and got as far as torch.distributed
    interrupted: bool = False  # the user's Ctrl-C (or SIGTERM) went to the job
    ended: Sequence[Ended] = ()  # what --on-hang ended, in order
    attempts: int = 1  # how many attempts of the job torchrun ran
    db_option: str = ""  # what `watchdog incidents` needs to find them (`db_option`)
    unstored: Unstored | None = None  # what the database refused, and where it is kept


def threshold_text(policy: StallPolicy) -> str:
    """'hung after 3 s without progress (--stall-timeout)': the threshold in force."""
    if policy.fixed is not None:
        return f"hung after {policy.fixed:g} s without progress (--stall-timeout)"
    return (f"hung after {policy.floor:g} s without progress ({policy.k:g} x the job's pace if "
            f"longer; up to {policy.warmup:g} s at start-up)")


def db_option(database: Database) -> str:
    """' --db PATH' where `watchdog incidents` would not find `database` by itself (a `--db`
    other than $WATCHDOG_DB's or the default), so that the commands suggested work as
    printed."""
    try:
        found = database_of(None)
    except WatchdogError:  # a $WATCHDOG_DB that `incidents` would refuse
        found = None
    return "" if database == found else f" --db {shlex.quote(str(database))}"


def next_steps_text(incident: Incident, db: str,
                    still: StillHung | None = None, option: str = "") -> str:
    """After a hang that `--on-hang report` leaves running (or an exit whose peers `still`
    wait): where it is and what to do."""
    ident = printable(str(incident["id"]))
    stored = (f"hang incident {ident} is stored" if still is None else
              f"{still.text()}; incident {ident} ({Kind.RANK_EXITED}) is stored")
    return (f"watchdog: {stored} in {db}. The job is still hung: "
            "Ctrl-C ends it (--on-hang kill would have ended it);\n"
            f"watchdog:   `watchdog incidents show {ident}{option} --html report.html` writes "
            "it as a page to attach to a ticket")


def ending_text(ended: Ended, what: str) -> str:
    """The line said as --on-hang ends `what`: 'watchdog: ending the hung job (--on-hang
    kill)', or for an exit whose peers still wait, 'watchdog: ranks 0,1,3 still wait 10 s after
    rank 2 exited, and the launcher did not end them: ending the job (--on-hang kill)'."""
    why = "" if ended.still is None else f"{ended.still.text()}: "
    return f"watchdog: {why}ending {what} (--on-hang {ended.action})"


def ended_text(end: RunEnd) -> str:
    """The run's last lines: how the job ended, and what the watchdog saw of it."""
    lasted = f"after {end.lasted:.0f} s"
    killed = next((e for e in end.ended if e.action == "kill"), None)
    if killed is not None:
        first = f"watchdog: {_killed_text(killed, lasted, end.code)}"
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
    return f"{first}; {_story_text(end)}{_incidents_text(end)}"


def _killed_text(killed: Ended, lasted: str, code: int) -> str:
    """'ended the hung job after 20 s (exit code 3): <the verdict>', or, for an exit whose peers
    still waited, 'ended the job after 75 s (exit code 3): ranks 0-2 still waited ...'."""
    summary = printable(str(killed.incident["summary"]))
    if killed.still is None:
        return f"ended the hung job {lasted} (exit code {code}): {summary}"
    return (f"ended the job {lasted} (exit code {code}): {killed.still.text('still waited')}; "
            f"{summary}")


def _story_text(end: RunEnd) -> str:
    """How each attempt ended, where torchrun ran several or the watchdog ended one's workers
    (the first sentence says the rest); and, where a rank's exit ended the job with nothing
    ended by the watchdog, that it ended nothing."""
    parts = []
    if end.attempts > 1 or any(e.action == "restart" for e in end.ended):
        parts.append(f"{end.attempts} attempt{'s' if end.attempts > 1 else ''}: " + "; ".join(
            _attempt_text(end, attempt) for attempt in range(end.attempts)))
    exits = [i for i in end.incidents if i["kind"] == Kind.RANK_EXITED]
    if exits and not end.ended:
        if end.attempts == 1:
            parts.append(f"{_exit_words(exits[0])} ({Kind.RANK_EXITED})")
        parts.append("the watchdog ended nothing")
    return "".join(f"{part}; " for part in parts)


def _attempt_text(end: RunEnd, attempt: int) -> str:
    """'attempt 0 ended when rank 2 raised OSError (RANK_EXITED, torchrun restarted it)',
    'attempt 1 hung (MISSING_RANKS) and was ended by the watchdog (--on-hang kill)'."""
    mine = [i for i in end.incidents if i.get("attempt", 0) == attempt and is_hang(i)]
    acted = next((e for e in end.ended if e.incident.get("attempt", 0) == attempt), None)
    then = ["torchrun restarted it"] if attempt < end.attempts - 1 else []
    if not mine:
        return f"attempt {attempt} ended with no incident" + (f" ({then[0]})" if then else "")
    first, kind = mine[0], printable(str(mine[0]["kind"]))
    if acted is not None:
        by_us = f"ended by the watchdog ({', '.join([f'--on-hang {acted.action}', *then])})"
        if acted.still is not None:
            return (f"attempt {attempt}: {_exit_words(first)} ({kind}), "
                    f"{ranks_text(acted.still.waiting)} still waited {acted.still.waited:.0f} s "
                    f"later and were {by_us}")
        return f"attempt {attempt} hung ({kind}) and was {by_us}"
    said = ", ".join([kind, *then])
    if kind == Kind.RANK_EXITED:
        return f"attempt {attempt} ended when {_exit_words(first)} ({said})"
    return f"attempt {attempt} hung ({said})"


def _exit_words(incident: Incident) -> str:
    """'rank 2 raised OSError', 'rank 1 was killed by SIGKILL', 'rank 3 exited with code 0':
    how the first culprit of an exit incident ended."""
    culprits = incident["culprit_ranks"]
    row = next((r for r in incident["ranks"] if r["rank"] == culprits[0]), None)
    reason: ExitReason = (row.get("exit_reason") if row else None) or {}
    if "exception" in reason:
        how = f"raised {reason['exception']['type']}"
    elif "signal" in reason:
        how = f"{'were' if len(culprits) > 1 else 'was'} killed by {reason['signal']}"
    elif row is not None and row.get("exit_code") is not None:
        how = f"exited with code {row['exit_code']}"
    else:
        how = "exited"
    return printable(f"{ranks_text(culprits)} {how}")


def _incidents_text(end: RunEnd) -> str:
    """'2 incidents (1 exit, 1 hang), stored in DB: `watchdog incidents show ID` shows the
    latest', or where the database refused them, where they really are."""
    incidents = end.incidents
    if not incidents:
        return "no incident"
    exits = sum(1 for incident in incidents if incident["kind"] == Kind.RANK_EXITED)
    hangs = sum(1 for incident in incidents if is_hang(incident)) - exits
    notices, warnings = (sum(1 for incident in incidents if incident.get("severity") == severity)
                         for severity in ("notice", "warning"))
    resumed = sum(1 for incident in incidents if "resumed_at" in incident)
    counted = f"{len(incidents)} incident{'s' if len(incidents) > 1 else ''}"
    contradicted = f", {resumed} of them contradicted by the job" if resumed else ""
    kinds = ", ".join(f"{n} {word}{'s' if n > 1 else ''}{contradicted if word == 'hang' else ''}"
                      for n, word in ((exits, "exit"), (hangs, "hang"), (notices, "notice"),
                                      (warnings, "warning")) if n)
    return f"{counted} ({kinds}){_where_text(end)}"


def _where_text(end: RunEnd) -> str:
    latest = printable(str(end.incidents[-1]["id"]))
    if end.unstored is None:
        return (f", stored in {end.db}: `watchdog incidents show {latest}{end.db_option}` "
                "shows the latest")
    some = "" if end.unstored.count == len(end.incidents) else f"{end.unstored.count} of them "
    if end.unstored.kept is not None:
        return (f"; {some}not stored: {end.db} refused them; they wait in "
                f"{end.unstored.kept}, stored the next time a watchdog opens {end.db}")
    return f"; {some}not stored: {end.db} refused them, and they are only printed above"
