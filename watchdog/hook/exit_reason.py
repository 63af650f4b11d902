"""What an uncaught exception leaves in the beacon (runs inside a training rank as it exits).

The record is bounded (`beacon.MAX_EXIT_REASON`, 2 KB): the exception's type, the start of its
message and a few frames, innermost first. The innermost frames say where it was raised (often
inside torch); the innermost frames of the user's own code say what the user's program was
doing, however deep the library stack between them. Nothing here raises: a message whose str()
fails, or a traceback of any depth, still gives a record.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType

from watchdog.beacon import MAX_EXIT_REASON, RaisedException
from watchdog.frames import is_library_source

INNERMOST = 5  # frames kept from where it was raised, whatever their code
USER = 2  # and the innermost frames of the user's own code beyond those
MAX_MESSAGE = 1000  # characters; the rest of a long message (a tensor printed) is cut
MAX_FILE = 160  # characters of a path, kept from its end
MAX_FUNCTION = 80
MAX_DEPTH = 200  # innermost traceback entries looked at

Frame = tuple[str, str, int]


def describe(error: BaseException) -> RaisedException:
    """The record of `error`, encoded within MAX_EXIT_REASON bytes."""
    frames = _frames(error.__traceback__)
    beyond = [f for f in frames[INNERMOST:] if not is_library_source(f[1])][:USER]
    kept = [*frames[:INNERMOST], *beyond]
    record = RaisedException(type(error).__name__[:MAX_FUNCTION], _message(error),
                             tuple(kept))
    while len(record.encode()) > MAX_EXIT_REASON:
        record = _smaller(record)
    return record


def _smaller(record: RaisedException) -> RaisedException:
    """One step smaller: a shorter message first, then library frames from the outer end, then
    any frame but the innermost; an empty record at last."""
    if len(record.message) > 200:
        return RaisedException(record.type, record.message[:200], record.frames)
    frames = list(record.frames)
    for index in range(len(frames) - 1, 0, -1):
        if is_library_source(frames[index][1]):
            del frames[index]
            return RaisedException(record.type, record.message, tuple(frames))
    if len(frames) > 1:
        return RaisedException(record.type, record.message, tuple(frames[:-1]))
    return RaisedException(record.type, "", ())


def _message(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:
        return "<the exception's message could not be formatted>"
    return text[:MAX_MESSAGE]


def _frames(traceback: TracebackType | None) -> list[Frame]:
    """(function, file, line) of the innermost MAX_DEPTH traceback entries, innermost first."""
    entries: deque[TracebackType] = deque(maxlen=MAX_DEPTH)
    while traceback is not None:
        entries.append(traceback)
        traceback = traceback.tb_next
    frames = []
    for entry in reversed(entries):
        code = entry.tb_frame.f_code
        function = getattr(code, "co_qualname", code.co_name)
        frames.append((function[:MAX_FUNCTION], code.co_filename[-MAX_FILE:],
                       entry.tb_lineno or 0))
    return frames
