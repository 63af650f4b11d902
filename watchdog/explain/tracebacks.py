"""The ranks' own errors in a log, and the watchdog's own verdicts: what `watchdog explain` names
as the first failure before any classified line (the guide's rule: find the first rank that
failed and read its own traceback).

Stdlib only. A rank's traceback comes two ways: its stderr lines under torchrun, each prefixed
`[rankN]:`, and the error file torchrun inlines in its failure summary (`traceback : ...`, for
a script under `@record`). A rank whose exception only says it lost a peer is a victim, never
its own error. Memory stays bounded: one open traceback per rank, for at most `MAX_OPEN` ranks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from watchdog.frames import is_library_source
from watchdog.model import Kind, Severity

MAX_OPEN = 4096
MAX_MESSAGE = 500
# The literals of the lines read here, for the scan's fast search.
RANK_PREFIX, VERDICT_NEEDLE = "[rank", " in job "
_PREFIXED = re.compile(r"\[rank(\d{1,7})\]: ?(.*)")
_FRAME = re.compile(r'\s+File "([^"]+)", line (\d+), in (\S+)')
_EXCEPTION = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# An end someone else gave the rank (Ctrl-C, torchrun's SIGTERM, sys.exit), not its own error.
_ENDED = ("KeyboardInterrupt", "SystemExit", "SignalException")
_HANG_KINDS = "|".join(kind.value for kind in Kind if kind.severity is Severity.HANG)
_VERDICT = re.compile(rf"({_HANG_KINDS}) in job \S+ at \d\d:\d\d:\d\d$")


@dataclass(frozen=True)
class RankError:
    """A rank's own exception: its type, message and innermost frame of user code."""

    line_no: int
    rank: int
    type: str
    message: str
    frame: tuple[str, int, str] | None  # file, line, function

    def describe(self) -> str:
        text = f"rank {self.rank} raised {self.type}" + (f": {self.message}" if self.message
                                                         else "")
        if self.frame is not None:
            file, line, function = self.frame
            text += f", in {function} at {file}:{line}"
        return text + " (its own error: read its traceback; the other ranks' errors follow)"


@dataclass(frozen=True)
class VerdictLine:
    """The watchdog's own verdict, as `watchdog run` printed it: its kind and summary."""

    line_no: int
    kind: str
    summary: str

    def describe(self) -> str:
        return f"the watchdog's verdict, {self.kind}: {self.summary}"


@dataclass
class _Open:
    line_no: int
    frame: tuple[str, int, str] | None = None  # innermost user frame so far
    framed: bool = False  # a frame was read: the next unindented line is the exception


class OwnErrors:
    """Reads lines one by one; `first` is the earliest rank's own error, `verdict` the first
    verdict of the watchdog's. `is_symptom(text)` says whether an exception line only reports
    a lost peer (or a timeout waiting for one): the scan's classification."""

    def __init__(self, is_symptom: Callable[[str], bool]) -> None:
        self._is_symptom = is_symptom
        self.first: RankError | None = None
        self.verdict: VerdictLine | None = None
        self._open: dict[int, _Open] = {}
        self._verdict_at: tuple[int, str] | None = None  # a heading whose summary comes next

    @property
    def wants_next_line(self) -> bool:
        return self._verdict_at is not None

    def feed(self, line_no: int, line: str, rank: int | None = None) -> None:
        """One line of the log; `rank`, where the caller knows whose it is (torchrun's summary
        entry), for a line without a `[rankN]:` prefix."""
        if self._verdict_at is not None:
            (at, kind), self._verdict_at = self._verdict_at, None
            self.verdict = VerdictLine(at, kind, line.strip()[:MAX_MESSAGE])
            return
        prefixed = _PREFIXED.match(line)
        if prefixed is not None:
            self._traceback_line(line_no, int(prefixed.group(1)), prefixed.group(2))
        elif rank is not None:
            text = line[2:] if line.startswith("  ") else line
            self._traceback_line(line_no, rank, text.removeprefix("traceback : "))
        elif self.verdict is None and (verdict := _VERDICT.match(line)):
            self._verdict_at = (line_no, verdict.group(1))

    def _traceback_line(self, line_no: int, rank: int, text: str) -> None:
        if text.startswith("Traceback (most recent call last)"):
            if len(self._open) < MAX_OPEN or rank in self._open:
                self._open[rank] = _Open(line_no)
            return
        tb = self._open.get(rank)
        if tb is None or text.startswith(_CHAINED) or not text.strip():
            return
        frame = _FRAME.match(text)
        if frame is not None:
            tb.framed = True
            if not is_library_source(frame.group(1)):
                tb.frame = (frame.group(1), int(frame.group(2)), frame.group(3))
        elif tb.framed and not text[0].isspace():
            del self._open[rank]
            self._close(line_no, rank, tb, text)

    def _close(self, line_no: int, rank: int, tb: _Open, text: str) -> None:
        exception = _EXCEPTION.fullmatch(text.strip())
        if self.first is not None or exception is None:
            return
        kind, message = exception.group(1), (exception.group(2) or "")[:MAX_MESSAGE]
        if kind.rsplit(".", 1)[-1] in _ENDED or self._is_symptom(text):
            return
        self.first = RankError(line_no, rank, kind, message, tb.frame)

