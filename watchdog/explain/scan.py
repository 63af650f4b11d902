"""`watchdog explain`: classify NCCL, PyTorch and torchrun log lines into findings with a fix.

Stdlib only; runs in the CLI process (and wherever the agent classifies log tails). It streams:
lines are scanned in batches with `str.find` for the literals every rule needs (C speed), and
only the few lines that contain one are classified. Memory stays bounded by one batch, one
torchrun summary (capped) and a set of rank numbers.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from itertools import islice
from typing import TextIO

from watchdog.explain import rules
from watchdog.explain.advice import COLLECTIVE_TIMEOUT, PEER_EXITED
from watchdog.explain.findings import (
    CulpritLedger,
    FirstFailure,
    InferredFinding,
    LogFinding,
    SummaryFinding,
)
from watchdog.explain.torchrun import TorchrunSummary, is_summary_start
from watchdog.explain.tracebacks import (
    RANK_PREFIX,
    VERDICT_NEEDLE,
    OwnErrors,
    RankError,
    VerdictLine,
)
from watchdog.explain.versions import NEEDLE as VERSION_NEEDLE
from watchdog.explain.versions import VersionLedger
from watchdog.text import ranks_text

BATCH_LINES = 1024
MAX_LINE_CHARS = 8192  # a longer line read from a file is classified by its head
CHUNK_CHARS = 1 << 20
MAX_TEXT_CHARS = 2000
# The rules' literals, those of the lines the ranks' own errors are read from, and NCCL's
# version line (no finding, but compared between processes).
NEEDLES = (*rules.NEEDLES, RANK_PREFIX, VERDICT_NEEDLE, VERSION_NEEDLE)


def classify_line(line_no: int, line: str,
                  default_ranks: tuple[int, ...] = ()) -> LogFinding | None:
    """The finding one line is, if any. `default_ranks` stand in when the line names none."""
    level, message = rules.split_prefix(line)
    if rules.is_benign(line, level, message):
        return None
    for rule in rules.RULES:
        match = rule.match(line)
        if match is not None:
            cause, fix = rule.advice(match)
            ranks = rule.ranks(line) or default_ranks
            return LogFinding(line_no, line[:MAX_TEXT_CHARS], rule.category, ranks, cause, fix)
    return None


def is_symptom(line: str) -> bool:
    """Whether the line only reports a lost peer, or a timeout waiting for one: what every
    waiting rank prints once another failed."""
    finding = classify_line(0, line)
    return finding is not None and finding.category in (PEER_EXITED, COLLECTIVE_TIMEOUT)


def _candidates(text: str) -> list[int]:
    """Indexes of the lines of `text` that contain any rule's literal, ascending."""
    hits = sorted(at for needle in NEEDLES for at in _find_all(text, needle))
    indexes: list[int] = []
    index = last = 0
    for at in hits:
        index, last = index + text.count("\n", last, at), at
        if not indexes or indexes[-1] != index:
            indexes.append(index)
    return indexes


def _find_all(text: str, needle: str) -> Iterator[int]:
    at = text.find(needle)
    while at >= 0:
        yield at
        at = text.find(needle, at + 1)


class _Scan:
    """Classifies one stream batch by batch; torchrun's summary is read line by line."""

    def __init__(self, own: OwnErrors) -> None:
        self._summary: TorchrunSummary | None = None
        self._ledger = CulpritLedger()
        self.versions = VersionLedger()
        self._own = own

    def batch(self, first_line_no: int, batch: list[str]) -> Iterator[LogFinding]:
        """`batch` holds lines without their newline."""
        hits = iter(_candidates("\n".join(batch)))
        index = -1
        while True:
            if self._summary is not None or self._own.wants_next_line:  # every line counts
                index += 1
            else:
                index = next((hit for hit in hits if hit > index), len(batch))
            if index >= len(batch):
                return
            yield from self._line(first_line_no + index, batch[index].rstrip("\r"))

    def _line(self, line_no: int, line: str) -> Iterator[LogFinding]:
        if self._summary is None and is_summary_start(line):
            self._summary = TorchrunSummary(line_no, line)
            return
        entry_ranks: tuple[int, ...] = ()
        if self._summary is not None:
            self._summary.feed(line)
            entry_ranks = self._summary.entry_ranks()
        self._own.feed(line_no, line, entry_ranks[0] if entry_ranks else None)
        if self._summary is not None and self._summary.closed:
            yield from self.finish_summary()
            return
        self.versions.note(line_no, line)
        finding = classify_line(line_no, line, entry_ranks)
        if finding is not None:
            self._ledger.note(finding)
            yield finding

    def finish_summary(self) -> Iterator[LogFinding]:
        described = self._summary.describe() if self._summary is not None else None
        self._summary = None
        if described is not None:
            line_no, text, ranks, cause, fix = described
            finding = SummaryFinding(line_no, text, PEER_EXITED, ranks, cause, fix)
            self._ledger.note(finding)
            yield finding

    def culprit(self) -> InferredFinding | None:
        return self._ledger.culprit()


def explain_lines(lines: Iterable[str]) -> Iterator[LogFinding]:
    """Findings in line order, then the versions that differ between processes, then the
    inferred early-exit culprit (if any) last."""
    return _explain_batches(_batches(iter(lines)), OwnErrors(is_symptom))


def _batches(lines: Iterator[str]) -> Iterator[list[str]]:
    while batch := [line.rstrip("\n") for line in islice(lines, BATCH_LINES)]:
        yield batch


def _explain_batches(batches: Iterable[list[str]], own: OwnErrors) -> Iterator[LogFinding]:
    """Findings in line order; the ranks' own errors and the watchdog's verdicts go to `own`."""
    scan, line_no = _Scan(own), 1
    for batch in batches:
        yield from scan.batch(line_no, batch)
        line_no += len(batch)
    yield from scan.finish_summary()
    yield from scan.versions.findings()
    culprit = scan.culprit()
    if culprit is not None:
        yield culprit


def read_batches(stream: TextIO) -> Iterator[list[str]]:
    """The lines of `stream`, split at newlines only, in batches of about CHUNK_CHARS.

    A line that runs on past MAX_LINE_CHARS at a chunk's end keeps only its head, so memory
    stays within about one chunk whatever the input.
    """
    carry, skipping = "", False
    while chunk := stream.read(CHUNK_CHARS):
        if skipping:  # the rest of an overlong line whose head was already yielded
            cut = chunk.find("\n")
            if cut < 0:
                continue
            chunk, skipping = chunk[cut + 1 :], False
        lines = (carry + chunk).split("\n")
        carry = lines.pop()
        if len(carry) > MAX_LINE_CHARS:
            lines.append(carry[:MAX_LINE_CHARS])
            carry, skipping = "", True
        if lines:
            yield lines
    if carry:
        yield [carry]


def explain_main(paths: Sequence[str], as_json: bool, out: TextIO, stdin: TextIO) -> int:
    """`watchdog explain LOGFILE... [--json]`; '-' or no path reads stdin.

    Exit code 0 when every input was read (with or without findings), 1 when one could not be
    (the others are still explained). --json prints one list of finding objects, streamed.
    """
    chooser, count, unread = FirstFailure(), 0, 0
    inputs = paths or ["-"]
    out.write("[" if as_json else "")
    for path in inputs:
        where = "<stdin>" if path == "-" else path
        own = OwnErrors(is_symptom)
        try:
            for finding in _explain_input(path, stdin, own):
                chooser.note(finding, where)
                out.write(_as_json(finding, count) if as_json else _as_text(where, finding))
                count += 1
            chooser.note_own(own, where)
        except _UnreadableError as error:
            print(f"watchdog explain: cannot read {where}: {error}", file=sys.stderr)
            unread += 1
    if unread:
        print(f"  hint: {UNREADABLE_HINT}", file=sys.stderr)
    if as_json:
        out.write("\n]\n" if count else "]\n")
    elif unread < len(inputs):  # "no known failure found" in nothing read would be a claim
        out.write(_closing(chooser.result()))
    return 1 if unread else 0


UNREADABLE_HINT = ("give log files this user can read, or - (or none) to read stdin, e.g. "
                   "`torchrun ... 2>&1 | watchdog explain`")


class _UnreadableError(Exception):
    """An input could not be opened or read (as opposed to the output failing)."""


def _explain_input(path: str, stdin: TextIO, own: OwnErrors) -> Iterator[LogFinding]:
    try:
        with _open(path, stdin) as stream:
            yield from _explain_batches(read_batches(stream), own)
    except OSError as error:
        raise _UnreadableError(error.strerror or str(error)) from error


def _open(path: str, stdin: TextIO) -> AbstractContextManager[TextIO]:
    if path != "-":
        return open(path, encoding="utf-8", errors="replace", newline="\n")
    buffer = getattr(stdin, "buffer", None)
    if buffer is None:  # already decoded text, e.g. io.StringIO
        return nullcontext(stdin)
    return _borrowed(io.TextIOWrapper(buffer, encoding="utf-8", errors="replace", newline="\n"))


@contextmanager
def _borrowed(wrapper: io.TextIOWrapper) -> Iterator[TextIO]:
    """Decodes stdin leniently without closing it afterwards."""
    try:
        yield wrapper
    finally:
        wrapper.detach()


def _as_json(finding: LogFinding, index: int) -> str:
    return ("\n" if index == 0 else ",\n") + json.dumps(finding.to_json())


def _as_text(where: str, finding: LogFinding) -> str:
    ranks = f" ({ranks_text(finding.ranks)})" if finding.ranks else ""
    quoted = "".join(f"    | {line[:300]}\n" for line in finding.text.splitlines()[:12])
    return (
        f"{where}:{finding.line_no}: {finding.category}{ranks}\n{quoted}"
        f"  cause: {finding.cause}\n  fix:   {finding.fix}\n\n"
    )


def _closing(chosen: tuple[LogFinding | RankError | VerdictLine, str] | None) -> str:
    if chosen is None:
        return "no known failure found\n"
    finding, where = chosen
    if not isinstance(finding, LogFinding):
        return f"first failure: {where}:{finding.line_no}: {finding.describe()}\n"
    ranks = f" ({ranks_text(finding.ranks)})" if finding.ranks else ""
    return f"first failure: {where}:{finding.line_no}: {finding.category}{ranks}: {finding.cause}\n"
