"""Tails of log files (NCCL debug files, torchrun's per-rank logs) as evidence; runs in the agent.

Stdlib and the explain classifier only. Reads only the end of a file with positioned reads
(`tailfile`, which a helper running as the worker also runs), so the size of the file does not
matter. A file that does not exist (never created, already rotated away or deleted) gives no
lines rather than an error: log evidence is best effort and its absence is normal; so does a
path that is not a regular file. Other OS errors (permission denied) propagate.

Lines come back decoded leniently and printable: NUL bytes (the hole a copytruncate leaves
before a writer's next line) and ANSI colour codes are removed, other control characters become
'?', a carriage return keeps only what a terminal would show, blank lines are dropped, and a
line longer than the wire's texts is cut with a mark (`text.bounded`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from agent.tailfile import open_owned, read_end
from watchdog.explain.scan import classify_line
from watchdog.text import bounded

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x01-\x08\x0b-\x1f\x7f]")
_NCCL_FIELD = re.compile(r"%(.?)", re.DOTALL)


def _clean(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").replace("\x00", "")
    text = _ANSI.sub("", text.rstrip("\r")).rsplit("\r", 1)[-1]
    return _CONTROL.sub("?", text)


def tail_lines(start: int, data: bytes, max_lines: int = 200) -> list[str]:
    """The complete lines of a span that `tailfile.read_end` read (`data` begins one byte
    before `start` unless `start` is 0): a partial first line is dropped, the last one kept
    even if its writer has not finished it."""
    mid_line = start > 0 and not data.startswith(b"\n")
    raw = (data[1:] if start > 0 else data).split(b"\n")
    if mid_line:
        raw = raw[1:]
    cleaned = (bounded(_clean(line)) for line in raw)
    return [line for line in cleaned if line.strip()][-max_lines:]


def read_tail(path: str, max_bytes: int = 256 * 1024, max_lines: int = 200,
              owner: int | None = None, follow: bool = True) -> list[str]:
    """The last complete lines of `path` (at most `max_bytes` read, `max_lines` returned),
    read in this process. A missing file, or one that is not a regular file, gives [];
    `owner` and `follow` as `tailfile.open_owned` takes them."""
    fd = open_owned(path, owner, follow)
    if fd is None:
        return []
    try:
        return tail_lines(*read_end(fd, max_bytes), max_lines=max_lines)
    finally:
        os.close(fd)


def expand_nccl_debug_file(pattern: str, host: str, pid: int) -> str:
    """The path NCCL writes for NCCL_DEBUG_FILE=`pattern`: %h host, %p pid, %% a percent sign.

    Like NCCL, the host name is cut at its first '.', '%' and '/' in it become '-', and other
    %-sequences are kept as they are. `host` is the worker's own hostname (the pod name in
    Kubernetes) and `pid` its pid inside its own pid namespace (the last NSpid in
    /proc/PID/status), which differ from the agent's view in containers.
    """
    short_host = host.split(".", 1)[0].replace("%", "-").replace("/", "-")
    fields = {"h": short_host, "p": str(pid), "%": "%"}
    return _NCCL_FIELD.sub(lambda match: fields.get(match.group(1), match.group(0)), pattern)


def relevant_lines(lines: Sequence[str], context: int = 3, max_lines: int = 60) -> list[str]:
    """NCCL WARN lines and the lines `watchdog explain` recognises (NCCL, PyTorch and torchrun
    errors), each with up to `context` lines before it, at most `max_lines` in all.

    The earliest is usually the cause and later ones its consequences, so when there are too
    many, the first ones are kept.
    """
    keep: set[int] = set()
    for index, line in enumerate(lines):
        if " NCCL WARN " in line or classify_line(index + 1, line) is not None:
            keep.update(range(max(0, index - context), index + 1))
    return [lines[index] for index in sorted(keep)][:max_lines]
