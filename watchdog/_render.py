"""Text for people: verdict wording, `watchdog status`, and the incident `watchdog run` prints
(runs in the CLI and the coordinator). Everything renders from the JSON-shaped dicts of
`_incident`, so a stored incident and a live one print alike. Functions return strings.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, TextIO

from watchdog._evidence import StallView, collective_frame, frame_site, stuck_frame
from watchdog._model import WORLD_GROUP, CollectiveRef

_RESET = "\033[0m"
_BOLD = "\033[1m"
_STATE_COLORS = {
    "RUNNING": "\033[32m",
    "FINISHED": "\033[32m",
    "WAITING": "\033[33m",
}
_ALARM = "\033[31m"  # every other state
_COLUMNS = ("RANK", "HOST", "PID", "STATE", "STEP", "LAST COLLECTIVE", "HEARTBEAT")
_CULPRIT_MARK = "*"


def clock(unix_seconds: float) -> str:
    """Local wall-clock time, 'HH:MM:SS'."""
    return time.strftime("%H:%M:%S", time.localtime(unix_seconds))


def ranks_text(ranks: Iterable[int]) -> str:
    """'rank 1', 'ranks 0,2,3' or, for runs of three or more, 'ranks 0-289,291-299': a verdict
    on a large job stays one readable sentence."""
    listed = list(ranks)
    if len(listed) == 1:
        return f"rank {listed[0]}"
    parts: list[str] = []
    start = 0
    for end in range(1, len(listed) + 1):
        if end == len(listed) or listed[end] != listed[end - 1] + 1:
            run = listed[start:end]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)))
            start = end
    return f"ranks {','.join(parts)}"


def group_text(group: str, members: Sequence[int]) -> str:
    """'group 0 (world)', 'group 1 (ranks 0,1)'."""
    if group == WORLD_GROUP:
        return f"group {group} (world)"
    return f"group {group} ({ranks_text(members)})" if members else f"group {group}"


def collective_text(ref: CollectiveRef) -> str:
    """'all_reduce #57 on group 0 (world)'."""
    return f"{ref.op} #{ref.seq} on {group_text(ref.group, ref.ranks)}"


def culprits_text(job: StallView, ranks: Sequence[int]) -> str:
    """'rank 1 (stuck in __getitem__ at train.py:42)': where the first rank with a stack is."""
    for rank in ranks:
        frame = stuck_frame(job.frames(rank))
        if frame is not None:
            whose = "" if len(ranks) == 1 else f"rank {rank} "
            return f"{ranks_text(ranks)} ({whose}stuck in {frame.function} at {frame_site(frame)})"
    return ranks_text(ranks)


def waiters_text(job: StallView, ranks: Iterable[int]) -> str:
    """'ranks 0,2,3 wait in all_reduce #58 on group 0 (world) since 12:00:03; rank 1 waits ...'"""
    places: dict[CollectiveRef | None, list[int]] = {}
    for rank in ranks:
        places.setdefault(job.waiting_in(rank), []).append(rank)
    return "; ".join(_wait_text(job, place, waiters) for place, waiters in places.items())


def _wait_text(job: StallView, place: CollectiveRef | None, ranks: list[int]) -> str:
    waits = f"{ranks_text(ranks)} {verb(ranks, 'waits')}"
    if place is None:
        return f"{waits} in a collective ({stack_place_text(job, ranks[0])})"
    entered = [job.alive[r].group(place.group) for r in ranks]
    since = min(progress.entered_at for progress in entered if progress is not None)
    return f"{waits} in {collective_text(place)} since {clock(since)}"


def stack_place_text(job: StallView, rank: int) -> str:
    frames = job.frames(rank)
    inside, caller = collective_frame(frames), stuck_frame(frames)
    if inside is None or caller is None:
        return "no stack"
    return f"{inside.function} called at {frame_site(caller)}"


def verb(ranks: Sequence[int], singular: str) -> str:
    plural = {"waits": "wait", "is": "are"}[singular]
    return singular if len(ranks) == 1 else plural


def use_color(stream: TextIO) -> bool:
    """Color only for a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def render_incident(incident: Mapping[str, Any], color: bool = False) -> str:
    """The incident as `watchdog run` prints it: verdict, rank table, stacks."""
    culprits = incident["culprit_ranks"]
    lines = [
        _paint(
            f"{incident['kind']} in job {incident['job_id']} at {clock(incident['detected_at'])}",
            _BOLD + _ALARM,
            color,
        ),
        _paint(incident["summary"], _BOLD, color),
    ]
    if incident.get("node"):
        lines.append(f"unreachable node: {incident['node']}")
    lines += ["", rank_table(incident["ranks"], culprits, color)]
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


def render_status(status: Mapping[str, Any], color: bool = False) -> str:
    """`watchdog status`: every job with its ranks and, where one exists, its verdict."""
    jobs = status["jobs"]
    if not jobs:
        return "no jobs"
    return "\n\n".join(_render_job(job, color) for job in jobs)


def render_incident_list(incidents: Sequence[Mapping[str, Any]]) -> str:
    """`watchdog incidents list`: one line per incident, newest first as given."""
    if not incidents:
        return "no incidents"
    return "\n".join(
        f"{i['id']}  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(i['detected_at']))}  "
        f"{i['job_id']}  {i['kind']}  {i['summary']}"
        for i in incidents
    )


def rank_table(
    rows: Sequence[Mapping[str, Any]], culprits: Collection[int] = (), color: bool = False
) -> str:
    """A fixed-width table, one line per rank; culprits marked with '*'."""
    cells = [_row_cells(row, row["rank"] in culprits) for row in rows]
    widths = [max(len(line[i]) for line in [list(_COLUMNS), *cells]) for i in range(len(_COLUMNS))]
    lines = ["  ".join(title.ljust(w) for title, w in zip(_COLUMNS, widths, strict=True)).rstrip()]
    for row, line in zip(rows, cells, strict=True):
        padded = [cell.ljust(w) for cell, w in zip(line, widths, strict=True)]
        padded[3] = _paint(padded[3], _STATE_COLORS.get(row["state"], _ALARM), color)
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def _render_job(job: Mapping[str, Any], color: bool) -> str:
    nodes = ",".join(job["nodes"]) or "-"
    header = f"job {job['job_id']}  {job['state']}  world size {job['world_size']}  nodes {nodes}"
    verdict = job["verdict"]
    culprits = verdict["culprit_ranks"] if verdict else ()
    lines = [_paint(header, _BOLD, color), rank_table(job["ranks"], culprits, color)]
    if verdict:
        lines.append(_paint(f"{verdict['kind']}: {verdict['summary']}", _BOLD + _ALARM, color))
    return "\n".join(lines)


def _row_cells(row: Mapping[str, Any], culprit: bool) -> list[str]:
    age = row["heartbeat_age"]
    state = row["state"]
    if state == "EXITED":
        state += " (killed)" if row["exit_code"] is None else f" ({row['exit_code']})"
    return [
        f"{_CULPRIT_MARK if culprit else ' '}{row['rank']}",
        row["host"],
        str(row["pid"]),
        state,
        str(row["step"]),
        _collective_cell(row["last_collective"]),
        "-" if age is None else f"{age:.1f}s",
    ]


def _collective_cell(last: Mapping[str, Any] | None) -> str:
    """'all_reduce #57 g0 (pending)'."""
    if last is None:
        return "-"
    done = "done" if last["completed"] else "pending"
    return f"{last['op']} #{last['seq']} g{last['group']} ({done})"


def _culprit_evidence(row: Mapping[str, Any]) -> list[str]:
    lines = []
    if row["stack"]:
        lines += ["", f"rank {row['rank']} stack, innermost first:"]
        lines += [f"  {f['file']}:{f['line']} {f['function']}" for f in row["stack"]]
    for source, log, findings in (("NCCL log", "nccl_log", "nccl_findings"),
                                  ("output", "worker_log", "worker_findings")):
        if row.get(log):
            lines += ["", f"rank {row['rank']} {source}, last relevant lines:"]
            lines += [f"  {line}" for line in row[log]]
        for finding in row.get(findings, ()):
            lines += ["", f"  {finding['category']}: {finding['cause']}",
                      f"  fix: {finding['fix']}"]
    return lines


def _paint(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{_RESET}" if color else text
