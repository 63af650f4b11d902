"""Findings of `watchdog explain`, and which of them is the first failure.

Stdlib only; runs wherever log lines are classified. Everything here works in one pass with
bounded memory, so it applies to findings streamed from a log of any size.
"""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.explain.advice import COLLECTIVE_TIMEOUT, PEER_EXITED
from watchdog.explain.tracebacks import OwnErrors, RankError, VerdictLine
from watchdog.schema import LogFinding as LogFindingJson
from watchdog.text import ranks_text


@dataclass(frozen=True)
class LogFinding:
    line_no: int
    text: str
    category: str
    ranks: tuple[int, ...]
    cause: str
    fix: str

    def to_json(self) -> LogFindingJson:
        return {
            "line_no": self.line_no, "text": self.text, "category": self.category,
            "ranks": list(self.ranks), "cause": self.cause, "fix": self.fix,
        }


class SummaryFinding(LogFinding):
    """torchrun's "Failures / Root Cause" block; `ranks` lists its root cause first."""


class InferredFinding(LogFinding):
    """Concluded from several findings, not read from one line (see `CulpritLedger`)."""


class CulpritLedger:
    """What the early-exit inference needs from the findings seen so far."""

    MAX_RANKS = 1 << 16

    def __init__(self) -> None:
        self._named: set[int] = set()
        self._lost_peer: set[int] = set()
        self._summary: SummaryFinding | None = None
        self._first_peer_error: LogFinding | None = None

    def note(self, finding: LogFinding) -> None:
        if len(self._named) < self.MAX_RANKS:
            self._named.update(finding.ranks)
        if isinstance(finding, SummaryFinding):
            self._summary = self._summary or finding
        elif finding.category == PEER_EXITED and len(self._lost_peer) < self.MAX_RANKS:
            self._lost_peer.update(finding.ranks)
            self._first_peer_error = self._first_peer_error or finding

    def _silent_ranks(self) -> tuple[int, ...]:
        """Ranks below the highest rank named that no finding names, if they are few.

        A log from only some nodes leaves most ranks silent, so the silent ranks must not
        outnumber the ranks that reported losing a peer.
        """
        if not self._lost_peer:
            return ()
        highest = max(self._named)
        if highest + 1 - len(self._named) > len(self._lost_peer):
            return ()
        return tuple(rank for rank in range(highest) if rank not in self._named)

    def culprit(self) -> InferredFinding | None:
        silent = self._silent_ranks()
        anchor = self._summary or self._first_peer_error
        if not silent or anchor is None:
            return None
        left, lost = ranks_text(silent), ranks_text(sorted(self._lost_peer))
        text = f"(inferred) {lost} lost a peer; {left} reported no error"
        cause = f"{left} left the job early and {lost} then lost their connection to it: {left}"
        cause += " reported no error in this log"
        if self._summary is not None:
            text += " and is not in torchrun's failure list"
            cause += (
                " and torchrun does not list it as failed (exit code 0). torchrun's 'Root Cause' "
                f"({ranks_text(self._summary.ranks[:1])}) is a victim that only saw the "
                "connection drop"
            )
        fix = (
            f"find why {left} stopped early: every rank must run the same number of steps and "
            "collectives (uneven data per rank, early stopping decided per rank, a `return` or "
            "`break` under `if rank == ...`); agree on stopping with an all_reduce, or use "
            "DistributedSampler(drop_last=True) or DDP's join() for uneven inputs"
        )
        return InferredFinding(anchor.line_no, text, PEER_EXITED, silent, cause, fix)


class FirstFailure:
    """Picks the finding closest to the cause, in one pass over any number of findings.

    Preference: the earliest rank's own error (its exception, not a lost peer); else the
    watchdog's own verdict in the log; else an inferred early exit; else the first finding
    whose category is a cause (not a symptom every waiting rank prints: a lost peer or a
    collective timeout); else torchrun's summary, which reflects exit order better than
    interleaved output; else the first symptom.
    """

    _SYMPTOMS = (PEER_EXITED, COLLECTIVE_TIMEOUT)

    def __init__(self) -> None:
        self._best: dict[int, tuple[LogFinding | RankError | VerdictLine, str]] = {}

    def note_own(self, own: OwnErrors, source: str = "") -> None:
        """What one input showed of the ranks' own errors and the watchdog's verdicts."""
        if own.first is not None:
            self._best.setdefault(-2, (own.first, source))
        if own.verdict is not None:
            self._best.setdefault(-1, (own.verdict, source))

    def note(self, finding: LogFinding, source: str = "") -> None:
        if isinstance(finding, InferredFinding):
            tier = 0
        elif isinstance(finding, SummaryFinding):
            tier = 2
        else:
            tier = 3 if finding.category in self._SYMPTOMS else 1
        self._best.setdefault(tier, (finding, source))

    def result(self) -> tuple[LogFinding | RankError | VerdictLine, str] | None:
        """The chosen finding and the `source` it was noted with."""
        return self._best[min(self._best)] if self._best else None

