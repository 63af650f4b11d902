"""Wording shared by every message for people: clock times, rank lists, and escaping and
bounding of text that came from workers (any process).

One rank-list formatter serves verdicts, tables and `watchdog explain`, so a job's ranks read the
same wherever they appear; one escaper keeps every string a worker or an agent chose from
driving the terminal that shows it; one cutter keeps any such string within a size, visibly.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TypeVar, cast

T = TypeVar("T")

MAX_TEXT = 4096  # UTF-8 bytes of any one text a worker controls, wherever it travels
TRUNCATED = "…[truncated]"


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


LISTED_NAMES = 8  # past this many, names are given by their count, first and last


def names_text(names: Sequence[str], separator: str = ",") -> str:
    """'node-a,node-b'; past LISTED_NAMES, '16384 (node-00000 ... node-16383)': a job's nodes
    stay one short line at any size."""
    if len(names) <= LISTED_NAMES:
        return separator.join(names) or "-"
    return f"{len(names)} ({names[0]} ... {names[-1]})"


def parse_ranks(spec: str, limit: int) -> tuple[int, ...]:
    """'90000-90100,5' as ranks, sorted; ValueError for a spec that is not ranks and ranges of
    them, or that names more than `limit` ranks."""
    ranks: set[int] = set()
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a rank or a range of ranks (0-7)") from None
        if low < 0 or high < low:
            raise ValueError(f"{part.strip()!r} is not a range of ranks: from low to high, "
                             "from 0")
        if len(ranks) + high - low + 1 > limit:
            raise ValueError(f"more than {limit} ranks asked for at once")
        ranks.update(range(low, high + 1))
    return tuple(sorted(ranks))


def bounded(text: str, limit: int = MAX_TEXT) -> str:
    """`text` if it fits in `limit` bytes of UTF-8, else its beginning, cut on a character,
    with TRUNCATED after it, `limit` bytes in all: a text a worker chose (a job id, a frame's
    name, a log line) is cut where it enters, never a reason to drop what carries it."""
    if len(text) * 4 <= limit:  # the common case, without encoding: no character exceeds 4 bytes
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    room = max(0, limit - len(TRUNCATED.encode()))
    return raw[:room].decode("utf-8", "ignore") + TRUNCATED


def bounded_escaped(text: str, limit: int = MAX_TEXT) -> str:
    """`bounded`, its control characters (but newline and tab) escaped first (`\\x01`): a
    frame's name or a log line, where JSON would give each six bytes, a thousand times over."""
    return bounded(text.translate(_CONTROLS), limit)


def printable(text: str) -> str:
    """`text` safe for a terminal: every character that is not printable (ESC and the other C0
    and C1 controls, DEL, bidirectional overrides, line and paragraph separators) becomes an
    escape such as `\\x1b` or `\\u202e`; a plain space stays. Job ids, host, node, op, group and
    frame names, log lines: anything a worker or an agent sent passes here before a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


_CONTROLS = {code: _escape(chr(code)) for code in (*range(0x20), *range(0x7F, 0xA0))
             if chr(code) not in "\n\t"}


def printable_tree(value: T) -> T:
    """A copy of a JSON-shaped value (dicts, lists, strings, numbers) with every string, keys
    included, passed through `printable`: the same shape, so of the same type (a tuple comes
    back a list, as JSON has it)."""
    if isinstance(value, str):
        return cast(T, printable(value))
    if isinstance(value, dict):
        return cast(T, {printable_tree(k): printable_tree(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return cast(T, [printable_tree(v) for v in value])
    return value
