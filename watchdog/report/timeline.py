"""The per-rank timeline: one lane per group of alike ranks, their last collectives and last
progress against time, up to the moment of the verdict (CLI and coordinator processes).

Drawn as inline SVG from each rank row's `timeline` (the last collective of each of its groups
with the time it was entered, its last event, its exit). A lane of many ranks draws the spread
of their times as a band. Culprit lanes are marked and listed first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeGuard

from watchdog.report.groups import RowGroup
from watchdog.report.page import esc, state_color
from watchdog.schema import Timeline
from watchdog.text import clock

MAX_WINDOW_S = 600.0  # older events are drawn at the left edge, their time in the tooltip
MIN_WINDOW_S = 5.0
LANE_COLLECTIVES = 3  # process groups drawn per lane, the most recently entered
WIDTH, LABEL_W, PLOT_L, PLOT_R, NOW_X = 1100, 170, 180, 790, 802
TOP, LANE_H = 34, 30
END_LABEL_W = 110
_TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600)
NO_TIMELINE: Timeline = {"last_event_at": None, "exited_at": None, "collectives": []}


@dataclass
class Span:
    """When something happened to a lane's ranks: the earliest and the latest of them."""

    low: float
    high: float

    @classmethod
    def of(cls, times: Sequence[float]) -> Span | None:
        return cls(min(times), max(times)) if times else None


@dataclass
class LaneCollective:
    group: str
    op: str
    seq: int
    completed: bool
    entered: Span


@dataclass
class Lane:
    group: RowGroup
    last_event: Span | None
    exited: Span | None
    collectives: list[LaneCollective] = field(default_factory=list)

    @property
    def times(self) -> list[float]:
        spans = [self.last_event, self.exited, *(c.entered for c in self.collectives[:1])]
        return [s.low for s in spans if s is not None]


def lanes_of(groups: Sequence[RowGroup]) -> list[Lane]:
    return [_lane(group) for group in groups]


def _lane(group: RowGroup) -> Lane:
    timelines = [row.get("timeline") or NO_TIMELINE for row in group.rows]
    events = [at for t in timelines if _number(at := t.get("last_event_at"))]
    exits = [at for t in timelines if _number(at := t.get("exited_at"))]
    by_group: dict[str, Counter[tuple[str, int, bool]]] = {}
    entered: dict[tuple[str, str, int, bool], list[float]] = {}
    for timeline in timelines:
        for c in timeline.get("collectives") or ():
            if not isinstance(c, Mapping) or not _number(c.get("entered_at")):
                continue
            what = (str(c.get("op", "?")), _int(c.get("seq")), bool(c.get("completed")))
            by_group.setdefault(str(c.get("group", "?")), Counter())[what] += 1
            entered.setdefault((str(c.get("group", "?")), *what), []).append(c["entered_at"])
    collectives = []
    for name, counts in by_group.items():
        (op, seq, completed), _ = counts.most_common(1)[0]
        span = Span.of(entered[(name, op, seq, completed)])
        assert span is not None
        collectives.append(LaneCollective(name, op, seq, completed, span))
    collectives.sort(key=lambda c: c.entered.high, reverse=True)
    return Lane(group, Span.of(events), Span.of(exits), collectives[:LANE_COLLECTIVES])


def render_timeline(lanes: Sequence[Lane], end: float, end_label: str = "detected") -> str:
    """The SVG: time runs left to right and ends at `end` (the verdict, or now)."""
    if not lanes:
        return '<p class="muted">no ranks</p>'
    start = _start(lanes, end)
    scale = _Scale(start, end)
    height = TOP + LANE_H * len(lanes) + 8
    parts = [f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" width="100%" '
             f'role="img" aria-label="per-rank timeline">']
    parts += _axis(scale, height, end_label)
    progress = [lane.last_event.high for lane in lanes if lane.last_event]
    if progress:
        x = scale.x(max(progress))
        parts.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{height - 4}" '
                     'stroke="#607d8b" stroke-dasharray="3 3"><title>last progress of any rank: '
                     f"{esc(clock(max(progress)))}</title></line>")
    for index, lane in enumerate(lanes):
        parts += _lane_svg(lane, TOP + index * LANE_H, scale, end)
    parts.append("</svg>")
    return "".join(parts)


def _start(lanes: Sequence[Lane], end: float) -> float:
    times = [t for lane in lanes for t in lane.times if t <= end]
    span = end - min(times, default=end - MIN_WINDOW_S)
    span = min(max(span, MIN_WINDOW_S), MAX_WINDOW_S)
    return end - span * 1.06


class _Scale:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    def x(self, t: float) -> float:
        t = min(max(t, self.start), self.end)
        return PLOT_L + (PLOT_R - PLOT_L) * (t - self.start) / (self.end - self.start)


def _axis(scale: _Scale, height: int, end_label: str) -> list[str]:
    span = scale.end - scale.start
    step = next((s for s in _TICK_STEPS if span / s <= 8), _TICK_STEPS[-1])
    parts = [f'<line x1="{PLOT_L}" y1="{TOP - 8}" x2="{PLOT_R}" y2="{TOP - 8}" stroke="#b0bec5"/>']
    for k in range(0, math.floor(span / step) + 1):
        x = scale.x(scale.end - k * step)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP - 12}" x2="{x:.1f}" y2="{height - 4}" '
                     'stroke="#eceff1"/>')
        if k == 0 or PLOT_R - x > END_LABEL_W:  # no tick label under the end's
            label = f"{end_label} {clock(scale.end)}" if k == 0 else f"-{k * step}s"
            parts.append(f'<text x="{x:.1f}" y="{TOP - 16}" font-size="11" fill="#5f6b76" '
                         f'text-anchor="{"end" if k == 0 else "middle"}">{esc(label)}</text>')
    return parts


def _lane_svg(lane: Lane, y: int, scale: _Scale, end: float) -> list[str]:
    group, mid = lane.group, y + LANE_H / 2
    state = str(group.first.get("state", "?"))
    culprit = " culprit" if group.culprit else ""
    label = ("★ " if group.culprit else "") + group.label
    parts = [f'<g class="lane{culprit}" data-ranks="{esc(group.label)}" '
             f'data-state="{esc(state)}">']
    if group.culprit:
        parts.append(f'<rect x="0" y="{y}" width="{WIDTH}" height="{LANE_H}" fill="#fdecea"/>')
    parts.append(f'<text x="8" y="{mid + 4:.1f}" font-size="12" '
                 f'font-weight="{700 if group.culprit else 400}">{esc(_clip(label, 24))}'
                 f"<title>{esc(group.label)}</title></text>")
    stop = lane.exited.low if lane.exited else end
    if lane.last_event:
        x_event = scale.x(lane.last_event.low)
        parts.append(f'<line x1="{PLOT_L}" y1="{mid:.1f}" x2="{scale.x(lane.last_event.high):.1f}"'
                     f' y2="{mid:.1f}" stroke="#90a4ae" stroke-width="2"/>')
        parts.append(f'<rect class="since" x="{x_event:.1f}" y="{mid - 5:.1f}" '
                     f'width="{max(scale.x(stop) - x_event, 1.5):.1f}" height="10" rx="2" '
                     f'fill="{state_color(state)}" opacity="0.85"><title>{esc(state)} since its '
                     f"last progress at {esc(clock(lane.last_event.low))} "
                     f"({end - lane.last_event.low:.0f}s)</title></rect>")
    if lane.exited:
        x = scale.x(lane.exited.low)
        parts.append(f'<text x="{x:.1f}" y="{mid + 5:.1f}" font-size="15" text-anchor="middle" '
                     f'fill="#000">✕<title>exited at {esc(clock(lane.exited.low))}</title></text>')
    for index, c in enumerate(lane.collectives):
        parts += _collective_svg(c, mid, scale, label=index == 0)
    parts.append(f'<text x="{NOW_X}" y="{mid + 4:.1f}" font-size="12">{esc(_clip(_now(lane), 46))}'
                 f"<title>{esc(_now(lane))}</title></text></g>")
    return parts


def _collective_svg(c: LaneCollective, mid: float, scale: _Scale, label: bool) -> list[str]:
    x, x_high = scale.x(c.entered.low), scale.x(c.entered.high)
    name = f"{c.op} #{c.seq}"
    tip = (f"{name} on group {c.group}, entered {clock(c.entered.low)}"
           + (f" to {clock(c.entered.high)}" if x_high - x >= 1 else "")
           + (", completed" if c.completed else ", not completed"))
    parts = []
    if x_high - x >= 1:
        parts.append(f'<rect x="{x:.1f}" y="{mid - 7:.1f}" width="{x_high - x:.1f}" height="14" '
                     'fill="#37474f" opacity="0.15"/>')
    fill = "#37474f" if c.completed else "#fff"
    parts.append(f'<path class="collective" d="M{x:.1f} {mid - 6:.1f} l6 6 l-6 6 l-6 -6 z" '
                 f'fill="{fill}" stroke="#37474f" stroke-width="1.5"><title>{esc(tip)}</title>'
                 "</path>")
    if label:
        parts.append(f'<text x="{x:.1f}" y="{mid - 8:.1f}" font-size="10" fill="#37474f" '
                     f'text-anchor="middle">{esc(_clip(name, 28))}</text>')
    return parts


def _now(lane: Lane) -> str:
    """Where the lane's ranks are now: 'WAITING in all_reduce #8 (g0) · step 7'."""
    row = lane.group.first
    state = str(row.get("state", "?"))
    last = row.get("last_collective")
    where = ""
    if isinstance(last, Mapping):
        verb = "in" if not last.get("completed") else "after"
        where = f" {verb} {last.get('op')} #{last.get('seq')} (g{last.get('group')})"
    step = row.get("step")
    varies = "+" if lane.group.steps_vary else ""
    steps = f" · step {step}{varies}" if step is not None else ""
    return f"{state}{where}{steps}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and value > 0


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0
