"""One incident as an HTML page (`incidents show --html`, `run --report-html`, the web view):
the verdict sentence, the per-rank timeline, the merged stack tree, the ranks grouped by
behaviour, each culprit's evidence and the log findings with their explanations.

Renders whatever the incident JSON carries, and tolerates what it lacks: incidents of older
releases, and fields (severity, activity, exit reasons) that newer ones add.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Literal

from watchdog import __version__
from watchdog.atomic import write_atomically
from watchdog.frames import frame_site, is_library_frame, stuck_frame
from watchdog.model import MAX_FULL_ROWS
from watchdog.report.groups import RowGroup, group_ranks
from watchdog.report.page import document, esc, state_badge
from watchdog.report.stack_tree import as_frames, frames_of, render_tree
from watchdog.report.timeline import lanes_of, render_timeline
from watchdog.schema import Child, Incident, LogFinding, RankGroup, RankRow, RankTable
from watchdog.text import ranks_text

MAX_CULPRITS_SHOWN = 8
SEVERITY_CLASS = {"hang": "", "notice": " notice", "warning": " warning"}
# A rank's log lines, and what `watchdog explain` found in them.
_LOGS: tuple[tuple[str, Literal["nccl_log", "worker_log"]], ...] = (
    ("NCCL log", "nccl_log"), ("output", "worker_log"))
_FINDINGS: tuple[Literal["nccl_findings", "worker_findings"], ...] = (
    "nccl_findings", "worker_findings")


def incident_html(incident: Incident, nav: str = "") -> str:
    """The whole page; `nav` is a line of links above it (the web view's)."""
    title = f"{incident.get('kind', 'incident')} in {incident.get('job_id', '?')}"
    return document(title, [nav, *incident_sections(incident)])


def write_html(path: str, incident: Incident) -> None:
    """The page, written whole or not at all (`write_atomically`)."""
    write_atomically(path, incident_html(incident))


def incident_sections(incident: Incident) -> list[str]:
    rows = [r for r in incident.get("ranks") or () if isinstance(r, Mapping)
            and isinstance(r.get("rank"), int)]
    culprits = {r for r in incident.get("culprit_ranks") or () if isinstance(r, int)}
    groups = group_ranks(rows, culprits)
    alike = alike_groups(incident)
    detected = float(incident.get("detected_at") or time.time())
    return [
        verdict_html(incident, len(rows) + sum(g["count"] for g in alike)),
        "<h2>Where each rank is</h2>",
        render_timeline(lanes_of(groups), detected),
        _timeline_legend(),
        "<h2>Stacks of all ranks, merged</h2>",
        render_tree({int(r["rank"]): frames_of(r) for r in rows}, culprits,
                    without=[int(r["rank"]) for r in rows if not frames_of(r)]),
        "<h2>Ranks</h2>",
        group_table(groups),
        alike_table(alike),
        rank_table(rows, culprits),
        *culprit_sections(rows, culprits),
        findings_html(rows),
        f'<p class="muted">torch-hang-watchdog {esc(__version__)} · incident '
        f"{esc(incident.get('id', '?'))}</p>",
    ]


def verdict_html(incident: Incident, world: int) -> str:
    severity = str(incident.get("severity") or "hang")
    facts = [f"<span>job <b class=\"mono\">{esc(incident.get('job_id', '?'))}</b></span>",
             f"<span>detected <b>{esc(_when(incident.get('detected_at')))}</b></span>",
             f"<span><b>{world}</b> ranks</span>"]
    culprits = incident.get("culprit_ranks") or []
    if culprits:
        facts.append(f"<span>culprit <b>{esc(ranks_text(culprits))}</b></span>")
    waiting = incident.get("waiting_ranks") or []
    if waiting:
        facts.append(f"<span>waiting <b>{esc(ranks_text(waiting))}</b></span>")
    collective = incident.get("collective")
    if isinstance(collective, Mapping):
        op, seq, group = (esc(collective.get(k)) for k in ("op", "seq", "group"))
        facts.append(f"<span>collective <b>{op} #{seq}</b> on group {group}</span>")
    if incident.get("node"):
        facts.append(f"<span>unreachable node <b>{esc(incident['node'])}</b></span>")
    return (f'<h1>{esc(incident.get("kind", "?"))} <span class="badge">{esc(severity)}</span></h1>'
            f'<div class="verdict{SEVERITY_CLASS.get(severity, "")}">'
            f'<div class="sentence">{esc(incident.get("summary", ""))}</div>'
            f'<div class="facts">{"".join(facts)}</div></div>')


def group_table(groups: Sequence[RowGroup]) -> str:
    """One row per group of alike ranks."""
    head = ("<table class=\"groups\"><tr><th>ranks</th><th>hosts</th><th>state</th><th>step</th>"
            "<th>last collective</th><th>where</th><th>heartbeat</th></tr>")
    body = []
    for group in groups:
        row = group.first
        frame = stuck_frame(group.frames)
        where = f"{frame.function} ({frame_site(frame)})" if frame else "-"
        age = group.oldest_heartbeat
        step = f"{row.get('step', '-')}" + (" (varies)" if group.steps_vary else "")
        body.append(
            f'<tr class="{"culprit" if group.culprit else ""}">'
            f"<td>{'★ ' if group.culprit else ''}{esc(group.label)}"
            f"{f' ({len(group.rows)})' if len(group.rows) > 1 else ''}</td>"
            f"<td>{esc(group.hosts())}</td><td>{state_badge(row.get('state', '?'))}"
            f"{_exit_text(row)}</td><td>{esc(step)}</td><td class=\"mono\">"
            f"{esc(collective_text(row.get('last_collective')))}</td>"
            f"<td class=\"mono\">{esc(where)}</td><td>{_age(age)}</td></tr>")
    return head + "".join(body) + "</table>"


def alike_groups(table: RankTable) -> list[RankGroup]:
    """A large job's `rank_groups` (of an incident or a status job) that are well formed."""
    return [g for g in table.get("rank_groups") or () if isinstance(g, Mapping)
            and isinstance(g.get("count"), int) and isinstance(g.get("ranks"), list)]


def alike_table(groups: Sequence[RankGroup],
                listed: Callable[[int, int], str] | None = None) -> str:
    """A large job's other ranks: one row per group of ranks alike, as ranges; `listed`: the
    address of a page listing ranks first..last in full, to link each group's first ranks to."""
    if not groups:
        return ""
    body = []
    for group in groups:
        frame = stuck_frame(frames_of(group))
        pairs = [(r[0], r[1]) for r in group["ranks"] if isinstance(r, list) and len(r) == 2
                 and all(isinstance(end, int) for end in r)]
        runs = esc(",".join(f"{a}-{b}" if b != a else f"{a}" for a, b in pairs))
        if listed is not None and pairs:
            first, last = pairs[0]
            href = listed(first, min(last, first + MAX_FULL_ROWS - 1))
            runs = f'<a href="{esc(href)}">{runs}</a>'
        body.append(
            f"<tr><td class=\"mono\">{runs} ({esc(group['count'])})</td>"
            f"<td>{esc(group.get('hosts', '?'))}</td><td>{state_badge(group.get('state', '?'))}"
            f"</td><td>{esc(group.get('step', '-'))}</td><td class=\"mono\">"
            f"{esc(collective_text(group.get('last_collective')))}</td><td class=\"mono\">"
            f"{esc(f'{frame.function} ({frame_site(frame)})' if frame else '-')}</td></tr>")
    return ("<p>The other ranks, alike in state, step, last collective and stack:</p>"
            "<table class=\"groups\"><tr><th>ranks</th><th>hosts</th><th>state</th><th>step"
            "</th><th>last collective</th><th>where</th></tr>" + "".join(body) + "</table>")


def rank_table(rows: Sequence[RankRow], culprits: Collection[int]) -> str:
    """Every rank, one row each, folded: search it for one rank."""
    body = []
    for row in rows:
        frame = stuck_frame(frames_of(row))
        culprit = int(row["rank"]) in culprits
        body.append(
            f'<tr{" class=culprit" if culprit else ""}><td>{esc(row["rank"])}</td>'
            f"<td>{esc(row.get('host', ''))}</td><td>{esc(row.get('pid', ''))}</td>"
            f"<td>{esc(row.get('state', ''))}{_exit_text(row)}</td><td>{esc(row.get('step', ''))}"
            f"</td><td>{esc(collective_text(row.get('last_collective')))}</td>"
            f"<td>{esc(f'{frame.function} ({frame_site(frame)})' if frame else '-')}</td>"
            f"<td>{_age(row.get('heartbeat_age'))}</td></tr>")
    return (f"<details><summary>every rank, one row each ({len(rows)})</summary>"
            "<table class=\"ranks mono\"><tr><th>rank</th><th>host</th><th>pid</th><th>state</th>"
            "<th>step</th><th>last collective</th><th>where</th><th>heartbeat</th></tr>"
            + "".join(body) + "</table></details>")


def culprit_sections(rows: Sequence[RankRow], culprits: Collection[int]) -> list[str]:
    """Each culprit's own evidence: where it is, its whole stack, how it ended, its logs."""
    parts = []
    for row in [r for r in rows if int(r["rank"]) in culprits][:MAX_CULPRITS_SHOWN]:
        parts.append(f"<h2>Culprit: rank {esc(row['rank'])}</h2><div class=\"facts\">"
                     f"<span>host <b>{esc(row.get('host', '?'))}</b></span>"
                     f"<span>pid <b>{esc(row.get('pid', '?'))}</b></span>"
                     f"<span>state {state_badge(row.get('state', '?'))}{_exit_text(row)}</span>"
                     f"<span>step <b>{esc(row.get('step', '?'))}</b></span>"
                     + (f"<span>phase <b>{esc(row['phase'])}</b></span>" if row.get("phase")
                        else "") + "</div>")
        parts += [_exit_reason(row.get("exit_reason")), _activity(row.get("activity"))]
        parts.append(_stack_html("stack, innermost first", row.get("stack")))
        parts += [_child_html(child) for child in row.get("children") or ()
                  if isinstance(child, Mapping)]
        for title, key in _LOGS:
            lines = [str(line) for line in row.get(key) or ()]
            if lines:
                parts.append(f"<h3>{title}, last relevant lines</h3><pre>"
                             + esc("\n".join(lines)) + "</pre>")
    return parts


def _stack_html(title: str, stack: object) -> str:
    frames = [f for f in stack or () if isinstance(f, Mapping)] if isinstance(stack, list) else []
    if not frames:
        return ""
    return (f"<h3>{esc(title)}</h3><table class=\"mono\">"
            + "".join(f"<tr><td>{esc(f.get('function', '?'))}</td>"
                      f"<td>{esc(f.get('file', '?'))}:{esc(f.get('line', '?'))}</td></tr>"
                      for f in frames) + "</table>")


def _child_html(child: Child) -> str:
    """A child process the rank waits on (a DataLoader worker): its stack under its rank's."""
    worker = child.get("role") == "dataloader_worker"
    number = child.get("worker_id")
    name = (f"DataLoader worker{'' if number is None else f' {number}'}" if worker
            else "child process")
    cpu = child.get("cpu")
    work = f", {cpu:.0%} of a core" if isinstance(cpu, int | float) else ""
    title = f"its {name} (pid {child.get('pid')}, state {child.get('state') or '?'}{work})"
    why = child.get("error") or "none taken"
    return (_stack_html(f"{title}: stack, innermost first", child.get("stack"))
            or f"<h3>{esc(title)}</h3><p class=\"muted\">no stack: {esc(why)}</p>")


def findings_html(rows: Sequence[RankRow]) -> str:
    """NCCL and log findings of every rank, each explanation once with the ranks it came from."""
    found: dict[tuple[str, str, str], tuple[list[int], str]] = {}
    for row in rows:
        for key in _FINDINGS:
            findings: Sequence[LogFinding] = row.get(key) or ()
            for finding in findings:
                if not isinstance(finding, Mapping):
                    continue
                what = (str(finding.get("category", "?")), str(finding.get("cause", "")),
                        str(finding.get("fix", "")))
                ranks, sample = found.setdefault(what, ([], str(finding.get("text", ""))))
                if int(row["rank"]) not in ranks:
                    ranks.append(int(row["rank"]))
    if not found:
        return "<h2>Log findings</h2><p class=\"muted\">no NCCL or log line explains this</p>"
    parts = ["<h2>Log findings</h2>"]
    for (category, cause, fix), (ranks, sample) in found.items():
        parts.append(f'<div class="finding"><span class="badge">{esc(category)}</span> '
                     f"<b>{esc(ranks_text(sorted(ranks)))}</b><p>{esc(cause)}</p>"
                     f"<p><b>fix:</b> {esc(fix)}</p><pre>{esc(sample)}</pre></div>")
    return "".join(parts)


def collective_text(last: object) -> str:
    """'all_reduce #57 g0 (pending)', as the terminal table says it."""
    if not isinstance(last, Mapping):
        return "-"
    done = "done" if last.get("completed") else "pending"
    return f"{last.get('op')} #{last.get('seq')} g{last.get('group')} ({done})"


def _timeline_legend() -> str:
    return ('<p class="legend"><span>◆ a collective entered and completed</span>'
            "<span>◇ entered, not completed</span><span>grey line: progress up to the last "
            "event</span><span>bar: since the last progress, coloured by state</span>"
            "<span>✕ exited</span><span>dashed: the last progress of any rank</span></p>")


def _exit_text(row: RankRow | RankGroup) -> str:
    if row.get("state") != "EXITED":
        return ""
    code = row.get("exit_code")
    return f" <span class=\"muted\">({'killed' if code is None else esc(code)})</span>"


def _exit_reason(reason: object) -> str:
    if not isinstance(reason, Mapping):
        return ""
    exception = reason.get("exception")
    if isinstance(exception, Mapping):
        # Where the user's program was comes first: the innermost frames are often torch's.
        own = stuck_frame(as_frames(exception.get("frames")))
        where = ("" if own is None or is_library_frame(own) else
                 f"<p>in its own code at <b>{esc(own.function)}</b> ({esc(frame_site(own))})</p>")
        return (f"<h3>it raised</h3><pre>{esc(exception.get('type', '?'))}: "
                f"{esc(exception.get('message', ''))}</pre>{where}"
                + _stack_html("its frames, innermost first", exception.get("frames")))
    if reason.get("signal"):
        return f"<h3>it was ended by</h3><pre>{esc(reason['signal'])}</pre>"
    return ""


def _rate(value: float) -> str:
    return f"{value / 1e6:.1f} MB/s" if value >= 1e5 else f"{value:.0f} B/s"


# The incident's activity fields (coordinator.incident), as a reader says them, with units.
ACTIVITY_ROWS: dict[str, tuple[str, Callable[[float], str]]] = {
    "window": ("measured over", lambda v: f"{v:.1f} s"),
    "main_cpu": ("main thread CPU", lambda v: f"{v * 100:.0f}% of a core"),
    "process_cpu": ("process CPU", lambda v: f"{v * 100:.0f}% of a core"),
    "read_rate": ("reads", _rate),
    "write_rate": ("writes", _rate),
    "gpu_util": ("GPU busy", lambda v: f"{v:.0f}%"),
    "main_wait": ("main thread waiting for a CPU", lambda v: f"{v * 100:.0f}% of the time"),
}


def _activity(activity: object) -> str:
    if not isinstance(activity, Mapping) or not activity:
        return ""
    cells = "".join(f"<tr><td>{esc(label)}</td><td class=\"mono\">{esc(value)}</td></tr>"
                    for label, value in map(_activity_row, activity.items()))
    return f"<h3>activity</h3><table>{cells}</table>"


def _activity_row(item: tuple[object, object]) -> tuple[str, str]:
    """(label, value with its unit); a field this page does not know (a newer agent's), raw."""
    key, value = item
    label, unit = ACTIVITY_ROWS.get(str(key), (str(key), None))
    if value is None:
        return label, "not measured"
    if unit is not None and isinstance(value, int | float) and not isinstance(value, bool):
        return label, unit(value)
    return label, value if isinstance(value, str) else json.dumps(value)


def _age(age: object) -> str:
    return f"{age:.1f}s" if isinstance(age, int | float) else "-"


def _when(detected_at: object) -> str:
    if not isinstance(detected_at, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(detected_at))
