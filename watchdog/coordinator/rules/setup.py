"""Rule 2.3, start-up: ranks that wait in a process-group set-up call (init_process_group,
new_group) for members that never arrive.

A set-up call waits for every member: init_process_group in the rendezvous (the store at
MASTER_ADDR:MASTER_PORT, or the init method's address) and then for the connections between
the ranks; new_group for every rank of the world. Who waits there is what the hook declared
(`RankState.setup`), else what the stack shows (`startup.setup_call`). Then, in order:
- a rank outside the call (its stack in its own code, no group joined yet): it never reached it;
- ranks that never reported at all: they never started (their node never joined, or a RANK
  that does not fit: two processes claiming one rank leave another rank unclaimed);
- ranks still connecting to the store: nothing answers at the rendezvous address;
- every rank inside and past the store, none done: they cannot connect to one another.
Each verdict carries the `watchdog explain` advice that fits. When no rank waits in a set-up
call, or the evidence fits none of these cases, the later rules judge.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from watchdog.coordinator.startup import SETUP_CALLS, connecting
from watchdog.coordinator.view import StallView
from watchdog.coordinator.wording import culprits_text, verb
from watchdog.explain.advice import ADVICE, CONNECT_FAILED, RENDEZVOUS
from watchdog.frames import frame_site
from watchdog.model import WORLD_GROUP, Advice, CollectiveRef, Kind, Verdict
from watchdog.text import clock, ranks_text


def judge(job: StallView) -> Verdict | None:
    counted = Counter(seen.setup for seen in job.alive.values() if seen.setup)
    if not counted:
        return None
    call = max(counted, key=lambda c: (counted[c], c == SETUP_CALLS[0]))
    waiting = [r for r, seen in job.alive.items() if seen.setup == call]
    ref = CollectiveRef(WORLD_GROUP, tuple(range(job.snapshot.world_size)), 0, call)
    outside = [r for r, seen in job.alive.items() if not seen.setup and seen.blameable
               and (call != "init_process_group" or not seen.state.groups)]
    if outside:
        return _never_reached(job, call, outside, waiting, ref)
    reported = {state.rank for state in job.snapshot.ranks}
    absent = [r for r in range(job.snapshot.world_size) if r not in reported]
    if absent:
        return _never_started(job, call, absent, waiting, ref)
    if len(waiting) < len(job.alive):
        return None  # the others wait elsewhere: the collective rules judge it
    stuck = [r for r in waiting if connecting(job.alive[r].stack)]
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
    states = [job.alive[r].state for r in stuck]
    address = next((s.rendezvous for s in states if s.rendezvous), "MASTER_ADDR:MASTER_PORT")
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
    ages = [age for r in ranks if (age := job.alive[r].state.setup_age) is not None]
    since = f" since {clock(job.snapshot.now - max(ages))}" if ages else ""
    caller = next((frame for r in ranks if (frame := job.alive[r].stuck) is not None), None)
    return since + (f" (called at {frame_site(caller)})" if caller is not None else "")


def _advice(category: str) -> Advice:
    cause, fix = ADVICE[category]
    return Advice(category, cause, fix)
