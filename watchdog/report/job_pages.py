"""The web view's pages besides incidents: the jobs a coordinator follows, one job's ranks at a
glance, the login form and errors (coordinator process, stdlib only). Every page renders from
`watchdog status --json`'s objects and stored incidents."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from watchdog.model import MAX_FULL_ROWS
from watchdog.report.groups import group_ranks
from watchdog.report.incident_page import (
    SEVERITY_CLASS,
    alike_groups,
    alike_table,
    group_table,
    verdict_html,
)
from watchdog.report.page import STATE_COLORS, document, esc, state_badge, state_color
from watchdog.report.terminal import slowest_text
from watchdog.report.timeline import lanes_of, render_timeline
from watchdog.schema import Frame, Incident, RankRow, Status, StatusJob
from watchdog.text import clock, names_text, ranks_text

REFRESH_S = 5
NUMBERED_CELLS = 256  # up to this many ranks, each cell of the grid shows its number


def job_href(job_id: str) -> str:
    return "/jobs/" + quote(job_id, safe="")


def incident_href(incident_id: str) -> str:
    return "/incidents/" + quote(incident_id, safe="")


def nav(title: str = "") -> str:
    here = f" · {esc(title)}" if title else ""
    return f'<p class="muted"><a href="/">torch-hang-watchdog: jobs</a>{here}</p>'


def jobs_page(status: Status, incidents: Sequence[tuple[Incident, str]]) -> str:
    """The jobs, and the newest incidents, each with the coordinator that stored it."""
    jobs = [j for j in status.get("jobs") or () if isinstance(j, Mapping)]
    parts = [nav(), "<h1>Jobs</h1>"]
    if not jobs:
        parts.append('<p class="muted">no job reports to this coordinator</p>')
    else:
        parts.append("<table class=\"jobs\"><tr><th>job</th><th>state</th><th>ranks</th>"
                     "<th>nodes</th><th>ranks by state</th><th>verdict</th></tr>")
        parts += [_job_row(job) for job in jobs]
        parts.append("</table>")
    parts.append("<h2>Recent incidents</h2>")
    parts.append(_incident_list(incidents))
    return document("torch-hang-watchdog: jobs", parts, refresh_s=REFRESH_S)


def job_page(job: StatusJob, asked: str = "") -> str:
    """A job's state, its current verdict, its ranks as a grid coloured by state. A large job's
    other ranks come as groups of ranks alike, each linked to a page that lists its first ranks
    in full; `asked`: the ranks this page was asked to list in full (a form asks for more)."""
    verdict = job.get("verdict")
    rows = _with_stacks([r for r in job.get("ranks") or () if isinstance(r, Mapping)
                         and isinstance(r.get("rank"), int)], verdict)
    culprits = set(verdict.get("culprit_ranks") or ()) if isinstance(verdict, Mapping) else set()
    job_id = str(job.get("job_id", "?"))
    parts = [nav(job_id), f'<h1>job <span class="mono">{esc(job_id)}</span> '
             f"{state_badge(job.get('state', '?'))}</h1>",
             f"<p class=\"muted\">world size {esc(job.get('world_size', '?'))} · nodes "
             f"{esc(names_text([str(n) for n in job.get('nodes') or ()], ', '))} · as of "
             f"{esc(clock(time.time()))}</p>"]
    alike = alike_groups(job)
    if isinstance(verdict, Mapping):
        parts.append(verdict_html(verdict, len(rows) + sum(g["count"] for g in alike)))
        if verdict.get("id"):
            parts.append(f'<p><a href="{esc(incident_href(str(verdict["id"])))}">the whole '
                         "incident: timeline, merged stacks, evidence</a></p>")
    else:
        parts.append('<p class="muted">no verdict: nothing is wrong that the coordinator can '
                     "see</p>")
    parts += _findings(job)
    parts += ["<h2>Ranks at a glance</h2>", rank_grid(rows, culprits)]
    groups = group_ranks(rows, culprits)
    parts += ["<h2>Where each rank is</h2>", render_timeline(lanes_of(groups), time.time(), "now"),
              "<h2>Ranks, grouped</h2>", group_table(groups),
              alike_table(alike, lambda first, last: f"{job_href(job_id)}?ranks={first}-{last}")]
    if alike or asked:
        parts.append(_ranks_form(asked))
    return document(f"job {job_id}", parts, refresh_s=REFRESH_S)


def _findings(job: StatusJob) -> list[str]:
    """The job's findings and notices beside its verdict (a STRAGGLER, a REPLICA_DESYNC), each
    linked to its incident, and the rank the others wait for most."""
    parts = []
    for finding in job.get("findings") or ():
        severity = str(finding.get("severity") or "warning")
        ended = " · ended" if finding.get("ended_at") else ""
        parts.append(f'<div class="verdict{SEVERITY_CLASS.get(severity, "")}"><span class="badge">'
                     f'{esc(finding.get("kind", "?"))}</span> {esc(severity)}{ended}'
                     f'<div class="sentence">{esc(finding.get("summary", ""))}</div>'
                     f'<a href="{esc(incident_href(str(finding.get("id", ""))))}">the incident'
                     "</a></div>")
    if slowest := job.get("slowest"):
        parts.append(f'<p class="muted">slowest: {esc(slowest_text(slowest))}</p>')
    return ["<h2>Findings and notices</h2>", *parts] if parts else []


def _ranks_form(asked: str) -> str:
    return ('<form method="get"><label>list these ranks in full (at most '
            f'{MAX_FULL_ROWS}): <input name="ranks" value="{esc(asked)}" '
            'placeholder="90000-90100,5"></label> <button>list</button></form>')


def rank_grid(rows: Sequence[RankRow], culprits: set[int]) -> str:
    numbered = len(rows) <= NUMBERED_CELLS
    cells = []
    for row in sorted(rows, key=lambda r: int(r["rank"])):
        rank, state = int(row["rank"]), str(row.get("state", "?"))
        mark = " culprit" if rank in culprits else ""
        tip = f"rank {rank} · {state} · step {row.get('step', '?')} · {row.get('host', '')}"
        cells.append(f'<div class="cell{mark}" data-rank="{rank}" data-state="{esc(state)}" '
                     f'style="background:{state_color(state)}" title="{esc(tip)}">'
                     f"{rank if numbered else ''}</div>")
    counts = Counter(str(r.get("state", "?")) for r in rows)
    legend = "".join(f'<span><i style="background:{state_color(s)}"></i>{esc(s)} {n}</span>'
                     for s, n in sorted(counts.items(), key=_state_order))
    if culprits:
        legend += f"<span>outlined: culprit ({esc(ranks_text(sorted(culprits)))})</span>"
    return (f'<div class="grid{" numbered" if numbered else ""}">{"".join(cells)}</div>'
            f'<div class="legend">{legend}</div>')


def login_page(next_path: str, failed: bool) -> str:
    error = '<p style="color:#c62828">wrong token</p>' if failed else ""
    return document("torch-hang-watchdog: sign in", [
        '<form class="login" method="post" action="/login"><h1>torch-hang-watchdog</h1>',
        '<label for="token">the coordinator\'s token (a reader\'s)</label>',
        '<input id="token" name="token" type="password" autocomplete="current-password" '
        "autofocus required>", f'<input type="hidden" name="next" value="{esc(next_path)}">',
        error, '<button type="submit">sign in</button></form>'])


def error_page(code: int, message: str) -> str:
    return document(f"{code}", [nav(), f"<h1>{code}</h1><p>{esc(message)}</p>"])


def _with_stacks(rows: list[RankRow], verdict: Incident | None) -> list[RankRow]:
    """Live rows carry no stacks; the verdict's rows have the ones it was decided on."""
    if not isinstance(verdict, Mapping):
        return rows
    stacks: dict[int, list[Frame]] = {r.get("rank"): r.get("stack") for r in verdict.get("ranks")
                                      or () if isinstance(r, Mapping)}
    return [row if row.get("stack") or not stacks.get(row["rank"]) else
            {**row, "stack": stacks[row["rank"]]} for row in rows]


def _job_row(job: StatusJob) -> str:
    job_id = str(job.get("job_id", "?"))
    verdict = job.get("verdict")
    summary = (f"<b>{esc(verdict.get('kind', '?'))}</b>: {esc(verdict.get('summary', ''))}"
               if isinstance(verdict, Mapping) else '<span class="muted">none</span>')
    counts = Counter(str(r.get("state", "?")) for r in job.get("ranks") or ()
                     if isinstance(r, Mapping))
    for group in alike_groups(job):  # a large job's other ranks
        counts[str(group.get("state", "?"))] += group["count"]
    by_state = ", ".join(f"{n} {esc(s)}" for s, n in sorted(counts.items(), key=_state_order))
    return (f'<tr class="job" data-job="{esc(job_id)}"><td class="mono nowrap"><a href="'
            f'{esc(job_href(job_id))}">{esc(job_id)}</a></td>'
            f"<td>{state_badge(job.get('state', '?'))}</td><td>{esc(job.get('world_size', '?'))}"
            f"</td><td>{esc(names_text([str(n) for n in job.get('nodes') or ()], ', '))}</td>"
            f"<td>{by_state}</td><td class=\"verdict-cell\">{summary}</td></tr>")


def _incident_list(incidents: Sequence[tuple[Incident, str]]) -> str:
    if not incidents:
        return '<p class="muted">none stored</p>'
    rows = []
    for incident, coordinator in incidents:
        detected = incident.get("detected_at")
        when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(detected))
                if isinstance(detected, int | float) else "?")
        rows.append(f"<tr><td><a href=\"{esc(incident_href(str(incident.get('id', ''))))}\">"
                    f"{esc(when)}</a></td><td class=\"mono\">{esc(incident.get('job_id', '?'))}"
                    f"</td><td>{esc(incident.get('kind', '?'))}</td>"
                    f"<td>{esc(incident.get('summary', ''))}</td>"
                    f"<td class=\"mono\">{esc(coordinator)}</td></tr>")
    return ("<table><tr><th>detected</th><th>job</th><th>kind</th><th>summary</th>"
            "<th>coordinator</th></tr>" + "".join(rows) + "</table>")


def _state_order(item: tuple[str, int]) -> tuple[int, str]:
    order = list(STATE_COLORS)
    return (order.index(item[0]) if item[0] in order else len(order), item[0])
