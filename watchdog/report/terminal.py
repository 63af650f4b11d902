"""Text for people: `watchdog status`, `watchdog incidents` and the incident `watchdog run`
prints (CLI process). Everything renders from the JSON-shaped dicts of the coordinator's
`incident` module, so a stored incident and a live one print alike. Functions return strings.
Every public function escapes the strings it is given first (`text.printable`): job ids, hosts,
ops, frame names and log lines come from workers, and none of them may drive the terminal.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Sequence
from typing import Literal, TextIO

from watchdog.model import RankStatus, Severity
from watchdog.schema import (
    ExitReason,
    Incident,
    LastCollective,
    LogFinding,
    RankGroup,
    RankRow,
    SlowestRank,
    Status,
    StatusJob,
)
from watchdog.text import clock, names_text, printable_tree, ranks_text

_RESET = "\033[0m"
_BOLD = "\033[1m"
_CAUTION = "\033[33m"
_STATE_COLORS: dict[str, str] = {
    RankStatus.RUNNING: "\033[32m",
    RankStatus.FINISHED: "\033[32m",
    RankStatus.WAITING: _CAUTION,
    RankStatus.BUSY: _CAUTION,
}
_ALARM = "\033[31m"  # every other state
_COLUMNS = ("RANK", "HOST", "PID", "STATE", "STEP", "LAST COLLECTIVE", "HEARTBEAT")
_CULPRIT_MARK = "*"
MAX_RUNS = 4  # of a group's rank ranges, shown in its line
# A culprit's log lines, and what `watchdog explain` found in them.
_LOGS: tuple[tuple[str, Literal["nccl_log", "worker_log"],
                   Literal["nccl_findings", "worker_findings"]], ...] = (
    ("NCCL log", "nccl_log", "nccl_findings"), ("output", "worker_log", "worker_findings"))


def use_color(stream: TextIO) -> bool:
    """Color only for a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def render_incident(incident: Incident, color: bool = False) -> str:
    """The incident as `watchdog run` prints it: verdict, rank table, stacks."""
    incident = printable_tree(incident)
    culprits = incident["culprit_ranks"]
    severity = incident.get("severity", Severity.HANG)
    heading = f"{incident['kind']} in job {incident['job_id']} at {clock(incident['detected_at'])}"
    if severity != Severity.HANG:
        ended = incident.get("ended_at")
        moved_on = f"; moved on at {clock(ended)}" if isinstance(ended, int | float) else ""
        heading += f" ({severity}: the job is not hung{moved_on})"
    elif isinstance(resumed := incident.get("resumed_at"), int | float):
        heading += f" (the job moved on at {clock(resumed)}: it was not hung after all)"
    lines = [
        _paint(heading, _BOLD + (_ALARM if severity == Severity.HANG else _CAUTION), color),
        _paint(incident["summary"], _BOLD, color),
    ]
    if incident.get("node"):
        lines.append(f"unreachable node: {incident['node']}")
    advice = incident.get("advice")
    if advice:
        lines += [f"{advice['category']}: {advice['cause']}", f"fix: {advice['fix']}"]
    if incident.get("finding"):
        lines += [f"cause: {incident['finding']['cause']}", f"fix: {incident['finding']['fix']}"]
    lines += ["", rank_table(incident["ranks"], culprits, color,
                             incident.get("rank_groups") or ())]
    if incident["stack_groups"]:
        lines += ["", "stacks, fewest ranks first:"]
        who = [ranks_text(group["ranks"]) for group in incident["stack_groups"]]
        width = max(map(len, who))
        tops = [group["top"] for group in incident["stack_groups"]]
        lines += [f"  {ranks:<{width}}  {top}" for ranks, top in zip(who, tops, strict=True)]
    for row in incident["ranks"]:
        if row["rank"] in culprits:
            lines += _culprit_evidence(row)
    return "\n".join(lines)


def render_status(status: Status, color: bool = False) -> str:
    """`watchdog status`: every job with its ranks and, where one exists, its verdict."""
    jobs = printable_tree(status["jobs"])
    if not jobs:
        return "no jobs"
    return "\n\n".join(_render_job(job, color) for job in jobs)


def render_incident_list(incidents: Sequence[tuple[Incident, str]]) -> str:
    """`watchdog incidents list`: a header, then one line per incident, newest first as given,
    in columns; each with the coordinator that stored it ("-" where no name was recorded)."""
    if not incidents:
        return "no incidents"
    rows = [("ID", "DETECTED", "JOB", "KIND", "COORDINATOR", "SUMMARY")] + [
        (i["id"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i["detected_at"])),
         i["job_id"], _kind_cell(i), coordinator or "-", i["summary"])
        for i, coordinator in printable_tree(list(incidents))]
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)),
                                row[5]]) for row in rows)


def _kind_cell(incident: Incident) -> str:
    """'MISSING_RANKS', or 'MISSING_RANKS (resumed after 14 s)' for a hang the job
    contradicted: the list shows the watchdog's false alarms."""
    resumed = incident.get("resumed_at")
    if not isinstance(resumed, int | float):
        return str(incident["kind"])
    return f"{incident['kind']} (resumed after {resumed - incident['detected_at']:.0f} s)"


def rank_table(
    rows: Sequence[RankRow], culprits: Collection[int] = (), color: bool = False,
    groups: Sequence[RankGroup] = (),
) -> str:
    """A fixed-width table, one line per rank listed in full (culprits marked with '*'), then
    one per group of ranks alike (a large job's `rank_groups`)."""
    table = [(row["state"], _row_cells(row, row["rank"] in culprits))
             for row in printable_tree(rows)]
    table += [(group["state"], _group_cells(group)) for group in printable_tree(groups)]
    widths = [max(len(line[i]) for line in [list(_COLUMNS), *(c for _, c in table)])
              for i in range(len(_COLUMNS))]
    lines = ["  ".join(title.ljust(w) for title, w in zip(_COLUMNS, widths, strict=True)).rstrip()]
    for state, line in table:
        padded = [cell.ljust(w) for cell, w in zip(line, widths, strict=True)]
        padded[3] = _paint(padded[3], _STATE_COLORS.get(state, _ALARM), color)
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def _render_job(job: StatusJob, color: bool) -> str:
    header = (f"job {job['job_id']}  {job['state']}  world size {job['world_size']}  nodes "
              f"{names_text(job['nodes'])}")
    verdict = job["verdict"]
    culprits = verdict["culprit_ranks"] if verdict else ()
    lines = [_paint(header, _BOLD, color),
             rank_table(job["ranks"], culprits, color, job.get("rank_groups") or ())]
    if verdict:
        alarm = _ALARM if verdict.get("severity", Severity.HANG) == Severity.HANG else _CAUTION
        lines.append(_paint(f"{verdict['kind']}: {verdict['summary']}", _BOLD + alarm, color))
    for finding in job.get("findings", ()):
        lines.append(_paint(f"{finding['kind']} ({_severity(finding)}): {finding['summary']}",
                            _CAUTION, color))
        lines.append(f"  fix: {finding['finding']['fix']}")
    if slowest := job.get("slowest"):
        lines.append(f"slowest: {slowest_text(slowest)}")
    lines += [f"flagged, not trusted: rank {f['rank']} (pid {f['pid']} on {f['node']}): "
              f"{f['reason']}" for f in job.get("flagged", ())]
    return "\n".join(lines)


def _severity(finding: Incident) -> str:
    """'warning', or 'notice, ended' for a STRAGGLER whose ranks caught up."""
    severity = str(finding.get("severity", Severity.WARNING))
    return f"{severity}, ended" if finding.get("ended_at") else severity


def slowest_text(slowest: SlowestRank) -> str:
    """'rank 3 (host node-b), the others wait 0.41 s per step for it (82% of a step): a
    straggler' (or 'below the straggler's threshold'): shown even when no notice is due."""
    called = "a straggler" if slowest["straggler"] else "below the straggler's threshold"
    return (f"rank {slowest['rank']} (host {slowest['host'] or '?'}), the others wait "
            f"{slowest['lost_per_step']:.2f} s per step for it ({slowest['share']:.0%} of a "
            f"step): {called}")


def _group_cells(group: RankGroup) -> list[str]:
    """A group of ranks alike as a line of the table: its ranges where the rank goes."""
    runs = [f"{a}-{b}" if b > a else str(a) for a, b in group["ranks"][:MAX_RUNS]]
    more = f",... ({group['count']} ranks)" if len(group["ranks"]) > MAX_RUNS else (
        f" ({group['count']})")
    hosts = group["hosts"]
    return _cells(f" {','.join(runs)}{more}", f"{hosts} host{'' if hosts == 1 else 's'}", "-",
                  _state_cell(group["state"], group["exit_code"], None), group["step"],
                  group.get("setup"), group["last_collective"], None)


def _row_cells(row: RankRow, culprit: bool) -> list[str]:
    return _cells(f"{_CULPRIT_MARK if culprit else ' '}{row['rank']}", row["host"],
                  str(row["pid"]), _state_cell(row["state"], row["exit_code"],
                                               row.get("exit_reason")),
                  row["step"], row.get("setup"), row["last_collective"], row["heartbeat_age"])


def _state_cell(state: str, code: int | None, reason: ExitReason | None) -> str:
    """'EXITED (1)', 'EXITED (SIGKILL)': how an exited rank ended."""
    if state == RankStatus.EXITED:
        killed = (reason or {}).get("signal", "killed")
        state += f" ({killed})" if code is None else f" ({code})"
    return state


def _cells(rank: str, host: str, pid: str, state: str, step: int, setup: str | None,
           last: LastCollective | None, age: float | None) -> list[str]:
    return [rank, host, pid, state, str(step),
            f"{setup} (waiting)" if setup else _collective_cell(last),
            "-" if age is None else f"{age:.1f}s"]


def _collective_cell(last: LastCollective | None) -> str:
    """'all_reduce #57 g0 (pending)'."""
    if last is None:
        return "-"
    done = "done" if last["completed"] else "pending"
    return f"{last['op']} #{last['seq']} g{last['group']} ({done})"


def _culprit_evidence(row: RankRow) -> list[str]:
    lines = []
    raised = (row.get("exit_reason") or {}).get("exception")
    if raised:
        lines += ["", f"rank {row['rank']} raised {raised['type']}: {raised['message']}"]
        lines += [f"  {f['file']}:{f['line']} {f['function']}" for f in raised["frames"]]
    if row["stack"]:
        lines += ["", f"rank {row['rank']} stack, innermost first:"]
        lines += [f"  {f['file']}:{f['line']} {f['function']}" for f in row["stack"]]
    for source, log, findings in _LOGS:
        if row.get(log):
            lines += ["", f"rank {row['rank']} {source}, last relevant lines:"]
            lines += [f"  {line}" for line in row[log]]
        found: Sequence[LogFinding] = row.get(findings, ())
        for finding in found:
            lines += ["", f"  {finding['category']}: {finding['cause']}",
                      f"  fix: {finding['fix']}"]
    return lines


def _paint(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{_RESET}" if color else text
