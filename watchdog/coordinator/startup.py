"""Start-up hangs (coordinator process; pure): ranks that wait in a process-group set-up call
(init_process_group, new_group) for members that never arrive.

A set-up call waits for every member: init_process_group in the rendezvous (the store at
MASTER_ADDR:MASTER_PORT, or the init method's address) and then for the connections between
the ranks; new_group for every rank of the world. Who waits there is what the hook declared
(`RankState.setup`), else what the stack shows. Then, in order:
- a rank outside the call (its stack in its own code, no group joined yet): it never reached it;
- ranks that never reported at all: they never started (their node never joined, or a RANK
  that does not fit: two processes claiming one rank leave another rank unclaimed);
- ranks still connecting to the store: nothing answers at the rendezvous address;
- every rank inside and past the store, none done: they cannot connect to one another.
Each verdict carries the `watchdog explain` advice that fits.

Before every rank stepped, the warm-up grace holds a quiet job back, except where the evidence
already names a rank idle while its peers wait (`early_verdict_stands`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from watchdog.coordinator.evidence import StallView, frame_site, python_frames, stuck_frame
from watchdog.coordinator.wording import culprits_text, verb
from watchdog.explain.advice import ADVICE, CONNECT_FAILED, RENDEZVOUS
from watchdog.model import (
    WORLD_GROUP,
    Advice,
    CollectiveRef,
    JobSnapshot,
    Kind,
    RankStack,
    RankState,
    Verdict,
)
from watchdog.text import clock, ranks_text

SETUP_CALLS = ("init_process_group", "new_group")
STORE_CONNECT = frozenset({"_create_c10d_store", "TCPStore"})  # the rendezvous's client connect
_SETUP_DEPTH = 8  # innermost Python frames that may sit between the wait and the call


def setup_call(rank: RankState, stack: RankStack | None) -> str:
    """The set-up call the rank waits in ('' for none): what its hook declared, else the
    outermost such call among the innermost frames of its stack."""
    if rank.setup:
        return rank.setup
    frames = python_frames(stack.frames)[:_SETUP_DEPTH] if stack is not None else ()
    calls = [frame.function for frame in frames if frame.function in SETUP_CALLS]
    return calls[-1] if calls else ""


def connecting(stack: RankStack | None) -> bool:
    """Whether the stack shows the rank still connecting to the rendezvous store."""
    frames = python_frames(stack.frames)[:_SETUP_DEPTH] if stack is not None else ()
    return any(frame.function in STORE_CONNECT for frame in frames)


def setup_stall(job: StallView) -> Verdict | None:
    """The verdict for ranks stuck in a set-up call, or None when no rank waits in one (or the
    evidence fits none of the cases above: the other rules judge it then)."""
    stacks = job.snapshot.stacks
    calls = {r: setup_call(state, stacks.get(r)) for r, state in job.alive.items()}
    counted = Counter(call for call in calls.values() if call)
    if not counted:
        return None
    call = max(counted, key=lambda c: (counted[c], c == SETUP_CALLS[0]))
    waiting = [r for r, c in calls.items() if c == call]
    ref = CollectiveRef(WORLD_GROUP, tuple(range(job.snapshot.world_size)), 0, call)
    outside = [r for r, state in job.alive.items() if not calls[r] and job.blameable(r)
               and (call != "init_process_group" or not state.groups)]
    if outside:
        return _never_reached(job, call, outside, waiting, ref)
    reported = {state.rank for state in job.snapshot.ranks}
    absent = [r for r in range(job.snapshot.world_size) if r not in reported]
    if absent:
        return _never_started(job, call, absent, waiting, ref)
    if len(waiting) < len(job.alive):
        return None  # the others wait elsewhere: the collective rules judge it
    stuck = [r for r in waiting if connecting(stacks.get(r))]
    if stuck:
        return _cannot_reach_the_store(job, call, stuck, waiting, ref)
    summary = (f"{ranks_text(waiting)} all wait in {call}{_since(job, waiting)} and none "
               "completes: they reached the rendezvous but cannot connect to one another")
    return Verdict(Kind.ALL_IN_COLLECTIVE, summary, (), tuple(waiting), ref,
                   advice=_advice(CONNECT_FAILED))


def _never_reached(job: StallView, call: str, culprits: list[int], waiting: list[int],
                   ref: CollectiveRef) -> Verdict:
    summary = (f"{culprits_text(job, culprits)} never reached {call}; {ranks_text(waiting)} "
               f"{verb(waiting, 'waits')} there{_since(job, waiting)}")
    return Verdict(Kind.MISSING_RANKS, summary, tuple(culprits), tuple(waiting), ref)


def _never_started(job: StallView, call: str, absent: list[int], waiting: list[int],
                   ref: CollectiveRef) -> Verdict:
    duplicates = job.snapshot.duplicates
    summary = (f"{ranks_text(absent)} never started: no process of this job reported "
               f"{'it' if len(absent) == 1 else 'them'}; {ranks_text(waiting)} "
               f"{verb(waiting, 'waits')} in {call}{_since(job, waiting)}")
    cause = ("the ranks named never joined: their node never started them (or runs no "
             "watchdog agent), or the processes started have RANKs that do not fit "
             "(RANK >= WORLD_SIZE, or two processes with one RANK)")
    for rank, claims in sorted(duplicates.items()):
        where = " and ".join(f"pid {pid} on {host}" for host, pid in claims)
        summary += f"; rank {rank} is claimed by {len(claims)} processes ({where})"
        cause = (f"two processes claimed rank {rank}, so rank {absent[0]} has none: a wrong "
                 "RANK, or a stale process of an earlier run on the same rendezvous endpoint")
    advice = Advice(RENDEZVOUS, cause, ADVICE[RENDEZVOUS][1])
    return Verdict(Kind.MISSING_RANKS, summary, tuple(absent), tuple(waiting), ref,
                   advice=advice)


def _cannot_reach_the_store(job: StallView, call: str, stuck: list[int], waiting: list[int],
                            ref: CollectiveRef) -> Verdict:
    address = next((job.alive[r].rendezvous for r in stuck if job.alive[r].rendezvous),
                   "MASTER_ADDR:MASTER_PORT")
    cause = (f"nothing answers at the rendezvous store {address}: a wrong MASTER_ADDR or "
             "MASTER_PORT (or init method), a firewall, or the rank that hosts the store "
             "(rank 0, or torchrun's agent) is not up")
    advice = Advice(CONNECT_FAILED, cause, ADVICE[CONNECT_FAILED][1])
    others = [r for r in waiting if r not in stuck]
    connect = (f"{ranks_text(stuck)} cannot connect to the rendezvous store at {address} in "
               f"{call}{_since(job, stuck)}")
    if not others:
        return Verdict(Kind.ALL_IN_COLLECTIVE, connect, (), tuple(waiting), ref, advice=advice)
    summary = f"{connect}; {ranks_text(others)} {verb(others, 'waits')} for them there"
    return Verdict(Kind.MISSING_RANKS, summary, tuple(stuck), tuple(others), ref, advice=advice)


def _since(job: StallView, ranks: Sequence[int]) -> str:
    """' since 12:00:03 (called at train.py:94)': when the first of `ranks` entered the call,
    where a hook said, and where the first with a stack called it."""
    ages = [age for r in ranks if (age := job.alive[r].setup_age) is not None]
    since = f" since {clock(job.snapshot.now - max(ages))}" if ages else ""
    caller = next((frame for r in ranks if (frame := stuck_frame(job.frames(r))) is not None),
                  None)
    return since + (f" (called at {frame_site(caller)})" if caller is not None else "")


def _advice(category: str) -> Advice:
    cause, fix = ADVICE[category]
    return Advice(category, cause, fix)


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
