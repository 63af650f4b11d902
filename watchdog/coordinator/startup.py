"""Start-up (coordinator process; pure): which process-group set-up call (init_process_group,
new_group) a rank waits in, and whether it still connects to the rendezvous store; the verdict
on ranks stuck there is rule 2.3 (`rules/setup.py`).

Before every rank stepped, the warm-up grace holds a quiet job back, except where the evidence
already names a rank idle while its peers wait (`early_verdict_stands`).
"""

from __future__ import annotations

from collections.abc import Sequence

from watchdog.frames import by_identity, python_frames
from watchdog.model import Frame, JobSnapshot, Kind, RankStack, RankState, Verdict

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


# Before every rank stepped, only these verdicts may end the warm-up early: a rank idle in its
# own code while its peers wait for it (exits are judged at any time anyway).
_EARLY_KINDS = frozenset({Kind.MISSING_RANKS, Kind.COLLECTIVE_MISMATCH, Kind.RANK_STALLED})


def early_verdict_stands(snapshot: JobSnapshot, verdict: Verdict) -> bool:
    """Whether a verdict reached during the warm-up grace may be told now: an exit, or a hang
    whose culprits are live ranks whose stacks were taken, outside any set-up call, while other
    ranks wait in a collective. The verdict already showed that its culprits make no progress
    (a hang, not RANK_BUSY); a rank that was never seen, or waits in a set-up call itself (a
    slow rendezvous), gets the warm-up."""
    if verdict.kind is Kind.RANK_EXITED:
        return True
    if verdict.kind not in _EARLY_KINDS or not verdict.waiting_ranks or not verdict.culprit_ranks:
        return False
    ranks = {state.rank: state for state in snapshot.ranks if state.alive}
    for culprit in verdict.culprit_ranks:
        stack = snapshot.stacks.get(culprit)
        state = ranks.get(culprit)
        if state is None or stack is None or not stack.frames or setup_call(state, stack):
            return False
    return True
