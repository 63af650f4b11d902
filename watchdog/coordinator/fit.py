"""What leaves the coordinator, bounded in encoded bytes (runs in the coordinator): an incident
(stored, posted to a webhook, shown by `status`) and each job of a Status reply. Every text is
bounded where it enters, but 512 frames of 4 KiB names, times a thousand ranks, is not: past
its budget a record loses its stacks' frames and its log lines first, in steps, with a mark,
and its rank rows last; its verdict, culprits and summary always stay.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, TypeVar, cast

from watchdog.frames import TRUNCATED_FILE, hidden_by
from watchdog.schema import Incident
from watchdog.transport.limits import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_INCIDENT_BYTES = 8 * 1024 * 1024  # the contract: under 10 MiB at any size
# A whole Status reply, below the message limit with room for the protobuf around it; the jobs
# it lists share it equally, so one job's evidence never crowds out another job's answer.
MAX_STATUS_BYTES = MAX_MESSAGE_BYTES - 1024 * 1024
FRAME_LISTS = frozenset({"stack", "frames"})
LOG_LISTS = frozenset({"nccl_log", "worker_log"})
# (frames kept per stack, log lines kept per log), tried in turn until the record fits.
STEPS = ((64, 100), (16, 20), (4, 4), (1, 1), (0, 0))


def encoded_size(value: object) -> int:
    """Bytes of `value` as JSON goes out (ASCII: a control character costs six)."""
    return len(json.dumps(value))


def fit_incident(incident: Incident, limit: int = MAX_INCIDENT_BYTES) -> Incident:
    cut = fit(incident, limit)
    if cut is not incident:
        log.warning("incident %s was %d bytes encoded, over %d: its stacks and logs were cut",
                    incident["id"], encoded_size(incident), limit)
    return cut


def fit(record: T, limit: int) -> T:
    """`record` if it encodes within `limit` bytes, else a copy cut to fit (see above)."""
    if encoded_size(record) <= limit:
        return record
    for frames, lines in STEPS:
        cut = _cut(record, frames, lines, limit)
        if encoded_size(cut) <= limit:
            return cut
    return _without_rows(cut)


def _cut(value: T, frames: int, lines: int, limit: int) -> T:
    if isinstance(value, dict):
        return cast(T, {key: _cut_field(key, item, frames, lines, limit)
                        for key, item in value.items()})
    if isinstance(value, list):
        return cast(T, [_cut(item, frames, lines, limit) for item in value])
    return value


def _cut_field(key: str, value: Any, frames: int, lines: int, limit: int) -> Any:
    if key in FRAME_LISTS and isinstance(value, list) and len(value) > frames:
        hidden = 0  # what an earlier cut's mark said was not shown counts too
        last = value[-1]
        if isinstance(last, dict) and last.get("file") == TRUNCATED_FILE:
            value, hidden = value[:-1], hidden_by(str(last.get("function", "")))
        return [*value[:frames], _mark(max(0, len(value) - frames) + hidden, limit)]
    if key in LOG_LISTS and isinstance(value, list) and len(value) > lines:
        return value[len(value) - lines:]  # a log's last lines are the ones that tell
    return _cut(value, frames, lines, limit)


def _mark(cut: int, limit: int) -> dict[str, Any]:
    return {"function": f"…[{cut} frames not shown: the record was over {limit} bytes]",
            "file": TRUNCATED_FILE, "line": 0}


def _without_rows(value: T) -> T:
    """Every table of ranks emptied (`rank_groups` marks one): the last resort."""
    if isinstance(value, dict):
        rows: Sequence[str] = ("ranks", "rank_groups") if "rank_groups" in value else ()
        return cast(T, {key: [] if key in rows else _without_rows(item)
                        for key, item in value.items()})
    if isinstance(value, list):
        return cast(T, [_without_rows(item) for item in value])
    return value
