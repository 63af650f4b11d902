"""A worker as a node report carries it (`RankState`): a conversion of what the table last read
and observed of it (`agent.table`), reading nothing and changing nothing."""

from __future__ import annotations

import functools
import math

from agent import exits
from agent.worker import Worker
from watchdog import beacon
from watchdog.model import (
    NO_EVIDENCE,
    CheckEvidence,
    ExitReason,
    Frame,
    GroupProgress,
    RankState,
    bounded_frames,
)
from watchdog.text import bounded
from watchdog.transport.limits import MAX_REASON_FRAMES


def rank_state(worker: Worker, now: float) -> RankState:
    """The report entry for one worker, as of the table's last refresh."""
    ident = worker.identity
    status = worker.exit_status
    # What the agent itself knows of any worker; a beacon adds its rank's progress.
    state = functools.partial(
        RankState, job_id=ident.job_id, rank=ident.rank, local_rank=ident.local_rank,
        world_size=ident.world_size, host=ident.host, pid=ident.pid,
        proc_state=worker.proc_state, exited_at=worker.exited_at, activity=worker.activity,
        attempt=ident.attempt, uid=worker.owner.uid if worker.owner else None)
    exit_code = exits.exit_code(status) if status is not None else None
    snap = worker.snapshot
    if snap is None:
        return state(hooked=False, heartbeat_age=None, steps=0, events=0, last_event_at=0.0,
                     exit_code=exit_code, exit_reason=_killed(worker))
    hook_saw_exit = worker.exited_at is not None and snap.exit_state != beacon.EXIT_RUNNING
    setup = snap.setup
    return state(
        hooked=True,
        heartbeat_age=max(0.0, now - snap.heartbeat) if snap.heartbeat > 0 else None,
        progress_age=_age(now, snap.progress_at),
        pace=snap.pace,
        compile_age=_age(now, snap.compiling_since),
        steps=snap.steps, events=snap.events, last_event_at=snap.last_event_at,
        groups=tuple(GroupProgress(g.name, _members(g.ranks, ident.world_size), g.entered_seq,
                                   g.op, g.completed_seq, g.entered_at) for g in snap.groups),
        phase=snap.phase, phase_age=now - snap.phase_started if snap.phase else 0.0,
        phase_timeout=snap.phase_timeout,
        exit_code=snap.exit_code if hook_saw_exit else exit_code,
        clean_exit=snap.exit_state == beacon.EXIT_CLEAN,
        exit_reason=_raised(snap.raised, worker.oom_killed) if hook_saw_exit and snap.raised
        else _killed(worker),
        setup=setup.call, setup_age=_age(now, setup.entered_at) if setup.call else None,
        rendezvous=setup.rendezvous,
        evidence=check_evidence(snap.checks, worker.carries_fingerprints),
        environment=snap.environment if worker.carries_environment else None,
        waited=snap.waited, waited_sq=snap.waited_sq)


def _members(ranks: tuple[int, ...] | range, world_size: int) -> tuple[int, ...]:
    """A group of the whole world goes out as (): every report would otherwise carry
    world_size ranks per rank, 16k x 16k integers a second at scale. The coordinator reads ()
    as the world for group 0, and as the ranks reporting the group for any other. A range is
    the beacon's whole world, even where it no longer says the world the worker was verified
    with: never listed."""
    return () if isinstance(ranks, range) or len(ranks) == world_size else ranks


def _raised(raised: beacon.RaisedException, oom_killed: bool) -> ExitReason:
    """The exception the rank's beacon records, within the wire's bounds: its JSON holds
    whatever the rank wrote there (a line number of any size, 200 tiny frames)."""
    return ExitReason(exception=bounded(raised.type), message=bounded(raised.message),
                      frames=bounded_frames([Frame(function, file, line)
                                             for function, file, line in raised.frames],
                                            MAX_REASON_FRAMES),
                      oom_killed=oom_killed)


def _killed(worker: Worker) -> ExitReason | None:
    """The signal that ended the worker, where the agent saw its exit status."""
    name = exits.signal_name(worker.exit_status) if worker.exit_status is not None else ""
    return ExitReason(signal=name, oom_killed=worker.oom_killed) if name else None


def check_evidence(checks: beacon.CheckState, fingerprints: bool = True) -> CheckEvidence:
    """What a beacon says of its rank's checks, as a report carries it (with its fingerprints
    or without)."""
    if checks == beacon.NO_CHECKS:
        return NO_EVIDENCE
    return CheckEvidence(
        checks=checks.enabled,
        fingerprints=checks.fingerprints if fingerprints else (),
        unsynced_steps=checks.unsynced_steps, sampler_reuses=checks.sampler_reuses,
        sampler_reuse_step=checks.sampler_reuse_step, sampler_epoch=checks.sampler_epoch,
        ddp_change_step=checks.ddp_change_step, ddp_change_module=checks.ddp_change_module,
        ddp_change_group=checks.ddp_change_group, ddp_change=checks.ddp_change,
        nonfinite_step=checks.nonfinite_step, nonfinite_value=checks.nonfinite_value)


def _age(now: float, stamp: float) -> float | None:
    """Seconds since a beacon's time stamp; None for none (0) or one that is no time at all."""
    return max(0.0, now - stamp) if stamp > 0 and math.isfinite(stamp) else None
