"""The merged stack tree of an incident: every rank's main-thread stack folded into one tree, from
the outermost frame in (CLI and coordinator processes, stdlib only).

The frames all ranks share come first; where stacks part, each side lists its ranks, the
culprits' side first. Frames are compared as the incident's stack groups compare them: library
frames without their line number (ranks waiting in one collective sit on different lines of its
polling loop), the user's own frames with it; native frames are left out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from watchdog import schema
from watchdog.frames import FrameKey, frame_key, python_frames
from watchdog.model import Frame
from watchdog.report.page import esc
from watchdog.text import ranks_text

MAX_BRANCHES = 24  # sides shown at one split; the rest are summed up in one line
MAX_DEPTH = 48  # nested splits shown; deeper ones are summed up
SHOWN_FRAMES = 8  # a longer run of frames shows its ends and folds its middle


@dataclass
class StackNode:
    frame: Frame | None  # None for the root
    ranks: list[int] = field(default_factory=list)
    lines: set[int] = field(default_factory=set)
    children: dict[FrameKey, StackNode] = field(default_factory=dict)


def frames_of(row: schema.RankRow | schema.RankGroup) -> tuple[Frame, ...]:
    """A rank row's stack as frames, innermost first, native frames left out."""
    return as_frames(row.get("stack"))


def as_frames(stack: object) -> tuple[Frame, ...]:
    """The incident JSON's frames (a stack, an exception's) as frames, native ones left out;
    whatever is not a frame is skipped."""
    frames = tuple(Frame(str(f.get("function", "?")), str(f.get("file", "?")), _line(f))
                   for f in (stack if isinstance(stack, list) else ()) if isinstance(f, Mapping))
    return tuple(python_frames(frames))


def merge_stacks(stacks: Mapping[int, Sequence[Frame]]) -> StackNode:
    """One tree of every rank's stack (innermost first in `stacks`), outermost frame at the top."""
    root = StackNode(None)
    for rank in sorted(stacks):
        node = root
        node.ranks.append(rank)
        for frame in reversed(stacks[rank]):
            key = frame_key(frame)
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = StackNode(frame)
            child.ranks.append(rank)
            child.lines.add(frame.line)
            node = child
    return root


def render_tree(stacks: Mapping[int, Sequence[Frame]], culprits: Collection[int],
                without: Iterable[int] = ()) -> str:
    """The tree as HTML; `without` lists the ranks that have no stack."""
    root = merge_stacks({r: s for r, s in stacks.items() if s})
    parts = ['<div class="tree">']
    if root.ranks:
        parts.append(f'<div class="who">{_who(root.ranks, len(root.ranks))}</div>')
        _render_below(root, set(culprits), len(root.ranks), parts, depth=0)
    missing = sorted(without)
    if missing:
        parts.append(f'<p class="muted">no stack: {esc(ranks_text(missing))}</p>')
    parts.append("</div>")
    return "".join(parts)


def _render_below(node: StackNode, culprits: set[int], total: int, parts: list[str],
                  depth: int) -> None:
    """The children of `node`: one run of frames while all its ranks go on together, a split
    where they part."""
    ended = set(node.ranks).difference(*(c.ranks for c in node.children.values()))
    sides = sorted(node.children.values(), key=lambda c: _side_order(c.ranks, culprits))
    if len(sides) == 1 and not ended:
        _render_run(sides[0], culprits, total, parts, depth)
        return
    if depth >= MAX_DEPTH:
        parts.append(f'<p class="muted">{len(sides)} deeper splits not shown</p>')
        return
    parts.append('<div class="split">')
    for side in sides[:MAX_BRANCHES]:
        culprit = " culprit" if culprits.intersection(side.ranks) else ""
        parts.append(f'<div class="branch{culprit}" data-ranks="{esc(ranks_text(side.ranks))}">'
                     f'<div class="who">{_who(side.ranks, total)}</div>')
        _render_run(side, culprits, total, parts, depth + 1)
        parts.append("</div>")
    rest = [r for side in sides[MAX_BRANCHES:] for r in side.ranks]
    if rest:
        parts.append(f'<p class="muted">{len(sides) - MAX_BRANCHES} more stacks: '
                     f"{esc(ranks_text(sorted(rest)))}</p>")
    if ended:
        parts.append(f'<div class="branch"><div class="who">{_who(sorted(ended), total)}</div>'
                     '<p class="muted">the stack ends above</p></div>')
    parts.append("</div>")


def _render_run(first: StackNode, culprits: set[int], total: int, parts: list[str],
                depth: int) -> None:
    """`first` and the frames below it that the same ranks share, then what comes after."""
    run = [first]
    while len(run[-1].children) == 1:
        (child,) = run[-1].children.values()
        if len(child.ranks) != len(run[-1].ranks):
            break
        run.append(child)
    leaf = not run[-1].children
    rows = [_frame_html(node, leaf and node is run[-1]) for node in run]
    parts.append('<div class="frames">')
    if len(rows) > SHOWN_FRAMES:
        head, middle, tail = rows[:2], rows[2:-(SHOWN_FRAMES - 2)], rows[-(SHOWN_FRAMES - 2):]
        parts += head
        parts.append(f"<details><summary>{len(middle)} more frames</summary>"
                     f"{''.join(middle)}</details>")
        parts += tail
    else:
        parts += rows
    parts.append("</div>")
    if not leaf:
        _render_below(run[-1], culprits, total, parts, depth)


def _frame_html(node: StackNode, leaf: bool) -> str:
    frame = node.frame
    assert frame is not None
    lines = sorted(node.lines)
    name = PurePath(frame.file).name
    where = (f"{name}:{lines[0]}" if len(lines) == 1 else
             f"{name}, lines {', '.join(map(str, lines[:4]))}" + ("…" if len(lines) > 4 else ""))
    title = f"{frame.file}:{','.join(map(str, lines[:16]))}"
    return (f'<div class="frame{" leaf" if leaf else ""}" title="{esc(title)}">'
            f'<span class="fn mono">{esc(frame.function)}</span> '
            f'<span class="muted mono">({esc(where)})</span></div>')


def _who(ranks: Sequence[int], total: int) -> str:
    if len(ranks) == total and total > 1:
        return f"all {total} ranks"
    count = f" ({len(ranks)} of {total})" if len(ranks) > 1 else ""
    return f"{esc(ranks_text(ranks))}{count}"


def _side_order(ranks: Sequence[int], culprits: set[int]) -> tuple[bool, int, int]:
    """Culprits' side first, then the odd ones out (fewest ranks), then by rank."""
    return not culprits.intersection(ranks), len(ranks), ranks[0]


def _line(frame: Mapping[str, object]) -> int:
    line = frame.get("line")
    return line if isinstance(line, int) else 0
