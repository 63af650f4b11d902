"""Reads torchrun's failure summary (the "Failures: / Root Cause" block of ChildFailedError).

Stdlib only; used by `watchdog explain`. The block is kept up to a fixed number of lines: its
text is capped, and a block that never closes ends after `MAX_LINES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from watchdog.explain.rules import split_prefix

MAX_LINES = 2000  # error-file tracebacks can be long; an unclosed block ends here
MAX_TEXT_LINES = 40
MAX_ENTRIES = 256

_HEADS = ("Failures:", "Root Cause (first observed failure)")
_RANK = re.compile(r"rank\s*:\s*(\d{1,7})\b")
_EXIT = re.compile(r"exitcode\s*:\s*(-?\d{1,4})\b(?:.*\((SIG[A-Z0-9]+)\))?")
_CLOSE = re.compile(r"={20,}$")
_BY_TORCHRUN = "SIGTERM"  # what torchrun sends the remaining workers once one has failed


def is_summary_start(line: str) -> bool:
    return split_prefix(line)[1].strip() in (_HEADS[0], _HEADS[1] + ":")


@dataclass
class _Entry:
    rank: int
    root: bool
    exitcode: int | None = None
    signal: str = ""

    def describe(self) -> str:
        if self.exitcode is None:
            return f"rank {self.rank}"
        text = f"rank {self.rank} (exit code {self.exitcode}"
        if self.signal == _BY_TORCHRUN:
            text += ", SIGTERM: stopped by torchrun after another rank failed"
        elif self.signal:
            text += f", {self.signal}"
        return text + ")"


class TorchrunSummary:
    """Collects the ranks, exit codes and signals torchrun lists, line by line."""

    def __init__(self, line_no: int, first_line: str) -> None:
        self.line_no = line_no
        self.closed = False
        self._text = [first_line]
        self._lines = 1
        self._in_root = "Root Cause" in first_line
        self._entries: list[_Entry] = []

    def feed(self, line: str) -> None:
        self._lines += 1
        if len(self._text) < MAX_TEXT_LINES:
            self._text.append(line)
        message = split_prefix(line)[1].strip()
        rank, exit_code = _RANK.match(message), _EXIT.match(message)
        if message.startswith(_HEADS[1]):
            self._in_root = True
        elif rank and len(self._entries) < MAX_ENTRIES:
            self._entries.append(_Entry(int(rank.group(1)), self._in_root))
        elif exit_code and self._entries:
            self._entries[-1].exitcode = int(exit_code.group(1))
            self._entries[-1].signal = exit_code.group(2) or ""
        self.closed = bool(_CLOSE.match(message)) or self._lines >= MAX_LINES

    def entry_ranks(self) -> tuple[int, ...]:
        """The rank of the entry being read: lines of its traceback belong to it."""
        return (self._entries[-1].rank,) if self._entries else ()

    def describe(self) -> tuple[int, str, tuple[int, ...], str, str] | None:
        """(line_no, text, ranks with the root cause first, cause, fix); None without entries,
        when the heading was not torchrun's after all."""
        if not self._entries:
            return None
        roots = [entry for entry in self._entries if entry.root]
        others = [entry for entry in self._entries if not entry.root]
        ranks = tuple(dict.fromkeys(entry.rank for entry in roots + others))
        cause = "torchrun's failure summary"
        if roots:
            cause += f": its root cause (first observed failure) is {roots[0].describe()}"
        if others:
            cause += "; also failed: " + ", ".join(entry.describe() for entry in others)
        cause += (
            ". The root cause is only the first exit torchrun noticed: a rank that merely lost "
            "its connection to a dead peer often exits first"
        )
        fix = (
            "read each listed rank's own error above; a rank whose only error is a closed or "
            "reset connection is a victim, and a rank that is not listed may have left early"
        )
        if any(entry.signal == "SIGKILL" for entry in self._entries):
            fix += "; SIGKILL (-9) is often the kernel's OOM killer: check `dmesg` on that node"
        return self.line_no, "\n".join(self._text), ranks, cause, fix
