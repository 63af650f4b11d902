"""Versions that differ between the processes of one log (stdlib only): at NCCL_DEBUG=INFO, NCCL
prints its version once per process ("host:pid:tid [dev] NCCL INFO NCCL version 2.21.5+cuda12.4").
One line says nothing wrong; processes of one job that print different versions run different
NCCL builds (VERSION_MISMATCH), which the watchdog's ENV_MISMATCH says of a live job. Memory:
one entry per distinct version, at most MAX_VERSIONS, each with the processes that printed it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from watchdog.explain.advice import SAME_ENVIRONMENT_FIX, VERSION_MISMATCH
from watchdog.explain.findings import LogFinding
from watchdog.explain.rules import ranks_named

NEEDLE = "NCCL INFO NCCL version "
# NCCL's own prefix names the process (its host and pid): a line without it is no process's
_LINE = re.compile(r"([\w.-]+:\d+):\d+ \[\d+\] NCCL INFO NCCL version (\S+)")
MAX_VERSIONS = 16
MAX_PROCESSES = 1 << 16


class ComparedFinding(LogFinding):
    """Concluded by comparing lines of several processes, shown at the first line of its kind."""


@dataclass
class _Seen:
    line_no: int
    text: str
    processes: set[str] = field(default_factory=set)
    ranks: dict[int, None] = field(default_factory=dict)


class VersionLedger:
    """The NCCL versions a log's processes printed, and which differ from the most common."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}
        self._processes = 0

    def note(self, line_no: int, line: str) -> None:
        match = _LINE.search(line) if NEEDLE in line else None
        if match is None or self._processes >= MAX_PROCESSES:
            return
        process, version = match.groups()
        seen = self._seen.get(version)
        if seen is None:
            if len(self._seen) >= MAX_VERSIONS:
                return
            seen = self._seen[version] = _Seen(line_no, line[:2000])
        if process not in seen.processes:
            seen.processes.add(process)
            self._processes += 1
            seen.ranks.update(dict.fromkeys(ranks_named(line)))

    def findings(self) -> Iterator[LogFinding]:
        """One finding per version that differs from the one most processes printed (ties: the
        first printed)."""
        if len(self._seen) < 2:
            return
        common = max(self._seen, key=lambda v: len(self._seen[v].processes))
        others = len(self._seen[common].processes)
        for version, seen in self._seen.items():
            if version != common:
                n = len(seen.processes)
                cause = (f"{n} process{'es' if n > 1 else ''} of this log "
                         f"run{'s' if n == 1 else ''} NCCL {version} while {others} "
                         f"run{'s' if others == 1 else ''} NCCL {common}: ranks "
                         "built against different NCCL versions may hang or fail in their "
                         "first collective")
                yield ComparedFinding(seen.line_no, seen.text, VERSION_MISMATCH,
                                      tuple(seen.ranks), cause, SAME_ENVIRONMENT_FIX)
