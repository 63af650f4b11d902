"""Start-up (coordinator process; pure): which process-group set-up call (init_process_group,
new_group) a rank waits in, and whether it still connects to the rendezvous store; the verdict
on ranks stuck there is rule 2.3 (`rules/setup.py`). When a start-up is looked at before the
warm-up grace ends is the job's `Judgement`'s call.
"""

from __future__ import annotations

from collections.abc import Sequence

from watchdog.frames import by_identity, python_frames
from watchdog.model import Frame, RankStack, RankState

SETUP_CALLS = ("init_process_group", "new_group")
STORE_CONNECT = frozenset({"_create_c10d_store", "TCPStore"})  # the rendezvous's client connect
_SETUP_DEPTH = 8  # innermost Python frames that may sit between the wait and the call


def setup_call(rank: RankState, stack: RankStack | None) -> str:
    """The set-up call the rank waits in ('' for none): what its hook declared, else the
    outermost such call among the innermost frames of its stack."""
    if rank.setup:
        return rank.setup
    return _setup_in(stack.frames) if stack is not None else ""


@by_identity
def _setup_in(frames: Sequence[Frame]) -> str:
    calls = [f.function for f in python_frames(frames)[:_SETUP_DEPTH] if f.function in SETUP_CALLS]
    return calls[-1] if calls else ""


def connecting(stack: RankStack | None) -> bool:
    """Whether the stack shows the rank still connecting to the rendezvous store."""
    frames = python_frames(stack.frames)[:_SETUP_DEPTH] if stack is not None else ()
    return any(frame.function in STORE_CONNECT for frame in frames)
