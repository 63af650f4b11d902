"""What an agent may send, bounded (agent and coordinator): the limits every message is held to,
and the checks that apply them as `wire` converts it. A text over MAX_TEXT is cut (with a
mark), never refused; a rank or a time that cannot be is refused (MessageRejectedError). The
agent keeps to the same limits where it reads, so that nothing it sends is cut twice.
"""

from __future__ import annotations

import logging
import math
import re
import time

# The largest job the project supports, which the agent's beacon reader bounds too: a rank
# claiming a larger world is no rank of any job, and would make every list of "the world's
# ranks" that large. Imported "as" itself: re-exported.
from watchdog.beacon.layout import MAX_WORLD as MAX_WORLD
from watchdog.errors import MessageRejectedError
from watchdog.model import DATALOADER_WORKER
from watchdog.text import MAX_TEXT, bounded

# What is cut or dropped is said as the wire converts it: under its name, as before the limits
# had a module of their own.
log = logging.getLogger("watchdog.transport.wire")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_RANK = MAX_WORLD
MAX_FRAMES = 512
MAX_LOG_LINES = 200
MAX_SAMPLES = 8  # stacks of one rank per request: each pauses it
MAX_REASON_FRAMES = 64  # an exit reason's frames (the hook records a few within 2 KB)
MAX_ATTEMPT = 1 << 20
MAX_CHILDREN = 16  # child processes of one rank whose stacks come along (the agent keeps to it)
MAX_CHILD_FRAMES = 128  # a DataLoader worker's stack is a dozen frames deep (the agent cuts)
MAX_PID = 1 << 22  # the kernel's own limit (pid_max)
MAX_WORKER_ID = 1 << 16
MAX_CHILD_CPU = 4096.0  # cores
CHILD_ROLES = frozenset({"", DATALOADER_WORKER})
PROC_STATES = frozenset({"", *"RSDTtZXIWPK"})
SIGNAL = re.compile(r"(SIG[A-Z0-9+-]{1,12}|signal \d{1,3})?")
MAX_FINGERPRINTS = 64
FINGERPRINT_OF = frozenset({"parameters", "batch", "optimizer"})
MAX_DEVICE = 1 << 16  # a CUDA device index


SAY_EVERY_S = 60.0
_said: dict[str, float] = {}  # what (one of a few fixed words) -> when it was last said


def say_once(what: str, message: str, *args: object) -> None:
    """A warning, once a minute at most for each `what`: a rogue agent may send it 5 times a
    second."""
    now = time.monotonic()
    if now - _said.get(what, -SAY_EVERY_S) >= SAY_EVERY_S:
        _said[what] = now
        log.warning(message, *args)


def cut_text(value: str, what: str) -> str:
    if len(value) <= MAX_TEXT // 4:  # at most 4 bytes a character: no need to look closer
        return value
    cut = bounded(value)
    if cut != value:
        say_once(what, "an agent sent a %s of %d characters: cut to %d bytes", what,
                 len(value), MAX_TEXT)
    return cut


def checked_rank(value: int, what: str) -> int:
    if not -1 <= value < MAX_RANK:
        raise MessageRejectedError(f"{what} {value} is out of range")
    return value


def finite_time(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise MessageRejectedError(f"{what} is not a finite number")
    return value


# Rank states arrive 16k a second at scale: their fields are checked in one expression each, not
# one call per field. A sum is finite only when every term is (NaN and infinities propagate).
def cut_texts(*values: str) -> tuple[str, ...]:
    if max(map(len, values)) <= MAX_TEXT // 4:
        return values
    return tuple(cut_text(value, "text field") for value in values)


def check_times(total: float) -> None:
    if not math.isfinite(total):
        raise MessageRejectedError("a time field is not a finite number")
