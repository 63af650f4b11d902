"""The agent's table of training processes on this node: beacons, liveness, exits.

A worker is *verified* when its beacon, its /proc environment and its start time agree (for a
rank started without RANK in its environment, by torch.multiprocessing.spawn: when it maps its
beacon for writing); only verified, live workers are ever handed to py-spy.
"""

from __future__ import annotations

import glob
import logging
import math
import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from agent import activity, exits, procfs
from agent.logtail import expand_nccl_debug_file
from watchdog import beacon
from watchdog import env as _env
from watchdog.errors import BeaconError, BeaconNotReadyError
from watchdog.model import (
    NO_ACTIVITY,
    NO_EVIDENCE,
    Activity,
    CheckEvidence,
    ExitReason,
    Fingerprint,
    Frame,
    GroupProgress,
    RankState,
)

log = logging.getLogger(__name__)

STALE_BEACON_S = 60.0  # a beacon whose process died this long ago belongs to an old job
EXITED_RETENTION_S = 300.0  # keep reporting an exited worker this long, then forget it
UNHOOKED_SCAN_S = 2.0
NOT_READY_S = 5.0
# Reports that carry a rank's fingerprints after it took a new one: a few, in case one is shed
# on the way; every report would double the coordinator's cost of decoding a rank's state.
FINGERPRINT_REPORTS = 5


@dataclass
class Worker:
    identity: beacon.Identity  # from its beacon, or from its environment without a hook
    start_ticks: int
    verified: bool
    beacon_path: str = ""  # empty: a torchrun worker without the hook (stacks only)
    nccl_debug_file: str = ""  # NCCL_DEBUG_FILE with %h and %p expanded, if the worker set it
    master_addr: str = ""  # the job's rendezvous host: where its coordinator runs by default
    mapping: mmap.mmap | None = None
    snapshot: beacon.BeaconSnapshot | None = None
    exited_at: float | None = None
    window: activity.ActivityWindow = field(default_factory=activity.ActivityWindow)
    exit_status: int | None = None  # as waitpid reports it, where the agent could see it
    oom_counter: str = ""  # the file counting OOM kills in its memory cgroup...
    oom_kills: int | None = None  # ...and the count when it was found
    oom_killed: bool = False
    fingerprints_taken: int = 0  # how many the beacon said its rank had taken, last report
    fingerprint_reports: int = 0  # reports that still carry them

    @property
    def alive(self) -> bool:
        return self.exited_at is None

    def sample(self, now: float, stat: procfs.ProcStat, gpu_util: float | None) -> Activity:
        """Read the process's counters; its activity over the last few seconds."""
        return self.window.add(activity.read(self.identity.pid, now, stat), gpu_util)


class WorkerTable:
    def __init__(self, beacon_dir: str, scan_unhooked: bool = True, proc: str = "/proc",
                 observer: exits.ExitObserver | None = None) -> None:
        self.beacon_dir = beacon_dir
        self._scan_unhooked = scan_unhooked
        self._proc = proc
        self.exits = observer or exits.ExitObserver(None, None)
        self._boot = procfs.boot_time(proc)
        self._by_path: dict[str, Worker] = {}
        self._unhooked: dict[int, Worker] = {}
        self._ignored: set[str] = set()
        self._last_unhooked_scan = 0.0

    def workers(self) -> list[Worker]:
        return [*self._by_path.values(), *self._unhooked.values()]

    def refresh(self, now: float) -> None:
        """One pass: new beacons, fresh snapshots, exits. Errors are per worker, never fatal."""
        for path in sorted(glob.glob(os.path.join(self.beacon_dir, "*.beacon"))):
            if path not in self._by_path and path not in self._ignored:
                self._discover(path, now)
        self.exits.drain({w.identity.pid for w in self.workers()})
        for worker in list(self._by_path.values()):
            self._update(worker, now)
        if self._scan_unhooked and now - self._last_unhooked_scan >= UNHOOKED_SCAN_S:
            self._last_unhooked_scan = now
            self._scan_proc(now)
        for worker in self.workers():
            if not worker.alive and worker.exit_status is None:
                self._learn_exit(worker)
        self._forget_old(now)

    def find(self, job_id: str, rank: int) -> Worker | None:
        for worker in self.workers():
            if worker.identity.job_id == job_id and worker.identity.rank == rank:
                return worker
        return None

    def _discover(self, path: str, now: float) -> None:
        try:
            mapping, snap = _open_new(path, now)
        except BeaconNotReadyError:
            return  # its writer is creating it: the next scan reads it
        except BeaconError as e:
            log.warning("ignoring %s: %s", path, e)
            self._ignored.add(path)
            return
        ident = snap.identity
        stat = procfs.read_stat(ident.pid, self._proc)
        last_sign_of_life = max(snap.heartbeat, snap.exited_at)
        if (stat is None or stat.gone) and now - last_sign_of_life > STALE_BEACON_S:
            mapping.close()
            _remove_quietly(path)  # left behind by a job that ended while no agent watched
            return
        env = procfs.read_environ(ident.pid, self._proc) if stat is not None else None
        worker = Worker(ident, stat.start_ticks if stat else 0,
                        self._verify(ident, stat, env, path), path,
                        _nccl_debug_file(env, ident.pid),
                        (env or {}).get("MASTER_ADDR", ""), mapping, snap)
        self._watch_oom(worker)
        self._unhooked.pop(ident.pid, None)
        self._by_path[path] = worker
        log.info("tracking rank %d of job %s (pid %d, verified=%s)", ident.rank, ident.job_id,
                 ident.pid, worker.verified)

    def _verify(self, ident: beacon.Identity, stat: procfs.ProcStat | None,
                env: dict[str, str] | None, path: str) -> bool:
        """The pid is the process that wrote this beacon: a torchrun worker with the beacon's
        RANK, or a process started without RANK that maps the beacon for writing."""
        if stat is None or stat.gone or env is None:
            return False
        if procfs.start_time(stat, self._boot) > ident.created_at + 2.0:
            return False  # pid reused by a newer process
        if "RANK" in env:
            return env["RANK"] == str(ident.rank)
        return procfs.maps_for_writing(ident.pid, path, self._proc)

    def _update(self, worker: Worker, now: float) -> None:
        if worker.mapping is not None:
            try:
                worker.snapshot = beacon.read_beacon(worker.mapping)
            except BeaconError as e:
                log.warning("rank %d of %s: %s", worker.identity.rank, worker.identity.job_id, e)
        if worker.alive and not self._still_running(worker):
            self._exited(worker, now)

    def _exited(self, worker: Worker, now: float) -> None:
        """Note the exit, timed by the beacon where the hook recorded it, else by the kernel's
        event where one showed it, else now."""
        self._learn_exit(worker)
        snap = worker.snapshot
        event = self._exit_event(worker)
        if snap is not None and snap.exit_state != beacon.EXIT_RUNNING:
            worker.exited_at = snap.exited_at
        else:
            worker.exited_at = event[1] if event is not None else now
        ident = worker.identity
        log.info("rank %d of job %s (pid %d) exited", ident.rank, ident.job_id, ident.pid)

    def _still_running(self, worker: Worker) -> bool:
        stat = procfs.read_stat(worker.identity.pid, self._proc)
        if stat is not None and stat.exit_status is not None:
            worker.exit_status = stat.exit_status  # a zombie its parent has not reaped yet
        return stat is not None and not stat.gone and (
            worker.start_ticks == 0 or stat.start_ticks == worker.start_ticks)

    def _exit_event(self, worker: Worker) -> tuple[int, float] | None:
        """The kernel's record of this worker's exit; not that of an earlier process that had
        its pid."""
        event = self.exits.status(worker.identity.pid)
        return event if event is not None and event[1] >= worker.identity.created_at - 2.0 else None

    def _watch_oom(self, worker: Worker) -> None:
        worker.oom_counter = exits.oom_counter_path(worker.identity.pid, self._proc)
        worker.oom_kills = exits.oom_kills(worker.oom_counter) if worker.oom_counter else None

    def _learn_exit(self, worker: Worker) -> None:
        """How an exited worker ended, from what the observer saw since: its exit status, and
        whether the OOM killer killed it (its record, or its cgroup's count gone up)."""
        pid = worker.identity.pid
        event = self._exit_event(worker)
        if event is not None:
            worker.exit_status = event[0]
        killed = worker.exit_status is not None and exits.signal_name(worker.exit_status)
        if self.exits.oom_killed(pid, since=worker.identity.created_at):
            worker.oom_killed = True
        elif killed and worker.oom_counter and worker.oom_kills is not None:
            now_kills = exits.oom_kills(worker.oom_counter)
            worker.oom_killed = now_kills is not None and now_kills > worker.oom_kills

    def _scan_proc(self, now: float) -> None:
        known = {w.identity.pid for w in self._by_path.values()}
        for pid in procfs.list_pids(self._proc):
            if pid in known or pid in self._unhooked:
                continue
            worker = self._unhooked_worker(pid)
            if worker is not None:
                self._unhooked[pid] = worker
        for worker in list(self._unhooked.values()):
            if worker.alive and not self._still_running(worker):
                self._exited(worker, now)

    def _unhooked_worker(self, pid: int) -> Worker | None:
        stat = procfs.read_stat(pid, self._proc)
        if stat is None or stat.gone or not procfs.is_torchrun(
                procfs.read_cmdline(stat.ppid, self._proc)):
            return None
        env = procfs.read_environ(pid, self._proc)
        if env is None or not _env.is_torchrun_worker(env) or env.get(_env.AUTOINSTALL) == "1":
            return None  # not a worker, or a hooked one: its beacon (here or elsewhere) tells
        identity = beacon.Identity(
            _env.job_id(env), _env.int_env(env, "RANK", 0), _env.int_env(env, "LOCAL_RANK", 0),
            _env.int_env(env, "WORLD_SIZE", 1), _env.short_hostname(), pid,
            procfs.start_time(stat, self._boot), _env.int_env(env, _env.ATTEMPT, 0))
        worker = Worker(identity, stat.start_ticks, verified=True,
                        nccl_debug_file=_nccl_debug_file(env, pid),
                        master_addr=env.get("MASTER_ADDR", ""))
        self._watch_oom(worker)
        return worker

    def _forget_old(self, now: float) -> None:
        def expired(worker: Worker) -> bool:
            return worker.exited_at is not None and now - worker.exited_at > EXITED_RETENTION_S

        for pid in [pid for pid, w in self._unhooked.items() if expired(w)]:
            del self._unhooked[pid]
        for path in [path for path, w in self._by_path.items() if expired(w)]:
            worker = self._by_path.pop(path)
            if worker.mapping is not None:
                worker.mapping.close()
            _remove_quietly(path)


def _open_new(path: str, now: float) -> tuple[mmap.mmap, beacon.BeaconSnapshot]:
    """A beacon just found, mapped, and its first snapshot. One its writer has not finished
    creating raises BeaconNotReadyError, until NOT_READY_S after it was last written: then it
    never will be."""
    try:
        mapping = beacon.open_beacon(path)
        try:
            return mapping, beacon.read_beacon(mapping)
        except BeaconError:
            mapping.close()
            raise
    except BeaconNotReadyError as e:
        try:
            young = now - os.stat(path).st_mtime < NOT_READY_S
        except OSError:
            young = False
        if young:
            raise
        raise BeaconError(f"still not written {NOT_READY_S:.0f} s after its creation") from e


def _members(ranks: tuple[int, ...], world_size: int) -> tuple[int, ...]:
    """A group of the whole world goes out as (): every report would otherwise carry
    world_size ranks per rank, 16k x 16k integers a second at scale. The coordinator reads ()
    as the world for group 0, and as the ranks reporting the group for any other."""
    return () if len(ranks) == world_size else ranks


def _nccl_debug_file(env: dict[str, str] | None, pid: int) -> str:
    pattern = (env or {}).get("NCCL_DEBUG_FILE", "")
    return expand_nccl_debug_file(pattern, _env.short_hostname(), pid) if pattern else ""


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError as e:
        log.debug("could not remove %s: %s", path, e)


def rank_state(worker: Worker, now: float, gpu: Mapping[int, float] | None = None) -> RankState:
    """The report entry for one worker; `gpu` maps pids to their GPU utilisation."""
    ident = worker.identity
    stat = procfs.read_stat(ident.pid) if worker.alive else None
    live = stat is not None and not stat.gone
    status = worker.exit_status
    base = RankState(job_id=ident.job_id, rank=ident.rank, local_rank=ident.local_rank,
                     world_size=ident.world_size, host=ident.host, pid=ident.pid,
                     hooked=False, proc_state=stat.state if stat is not None else "",
                     heartbeat_age=None, steps=0, events=0, last_event_at=0.0,
                     exited_at=worker.exited_at,
                     activity=worker.sample(now, stat, (gpu or {}).get(ident.pid))
                     if stat is not None and live else NO_ACTIVITY,
                     exit_code=exits.exit_code(status) if status is not None else None,
                     exit_reason=_killed(worker), attempt=ident.attempt)
    snap = worker.snapshot
    if snap is None:
        return base
    hook_saw_exit = worker.exited_at is not None and snap.exit_state != beacon.EXIT_RUNNING
    setup = snap.setup
    return replace(
        base, hooked=True,
        heartbeat_age=max(0.0, now - snap.heartbeat) if snap.heartbeat > 0 else None,
        progress_age=_age(now, snap.progress_at),
        gap_p99=snap.gap_p99 if math.isfinite(snap.gap_p99) and snap.gap_p99 >= 0 else 0.0,
        gaps=snap.gaps,
        steps=snap.steps, events=snap.events, last_event_at=snap.last_event_at,
        groups=tuple(GroupProgress(g.name, _members(g.ranks, ident.world_size), g.entered_seq,
                                   g.op, g.completed_seq, g.entered_at) for g in snap.groups),
        phase=snap.phase, phase_age=now - snap.phase_started if snap.phase else 0.0,
        phase_timeout=snap.phase_timeout,
        exit_code=snap.exit_code if hook_saw_exit else base.exit_code,
        clean_exit=snap.exit_state == beacon.EXIT_CLEAN,
        exit_reason=_raised(snap.raised) if hook_saw_exit and snap.raised else base.exit_reason,
        setup=setup.call, setup_age=_age(now, setup.entered_at) if setup.call else None,
        rendezvous=setup.rendezvous,
        evidence=check_evidence(snap.checks, _new_fingerprints(worker, snap.checks)))


def _raised(raised: beacon.RaisedException) -> ExitReason:
    return ExitReason(exception=raised.type, message=raised.message,
                      frames=tuple(Frame(function, file, line)
                                   for function, file, line in raised.frames))


def _killed(worker: Worker) -> ExitReason | None:
    """The signal that ended the worker, where the agent saw its exit status."""
    name = exits.signal_name(worker.exit_status) if worker.exit_status is not None else ""
    return ExitReason(signal=name, oom_killed=worker.oom_killed) if name else None


def _new_fingerprints(worker: Worker, checks: beacon.CheckState) -> bool:
    """Whether this report carries the worker's fingerprints: one of the next few after its
    rank took one."""
    if checks.taken != worker.fingerprints_taken:
        worker.fingerprints_taken, worker.fingerprint_reports = checks.taken, FINGERPRINT_REPORTS
    if worker.fingerprint_reports <= 0:
        return False
    worker.fingerprint_reports -= 1
    return True


def check_evidence(checks: beacon.CheckState, fingerprints: bool = True) -> CheckEvidence:
    """What a beacon says of its rank's checks, as a report carries it (with its fingerprints
    or without)."""
    if checks == beacon.NO_CHECKS:
        return NO_EVIDENCE
    return CheckEvidence(
        checks=checks.enabled,
        fingerprints=tuple(Fingerprint(f.of, f.group, f.module, f.step, f.digest)
                           for f in checks.fingerprints) if fingerprints else (),
        unsynced_steps=checks.unsynced_steps, sampler_reuses=checks.sampler_reuses,
        sampler_reuse_step=checks.sampler_reuse_step, sampler_epoch=checks.sampler_epoch,
        ddp_change_step=checks.ddp_change_step, ddp_change_module=checks.ddp_change_module,
        ddp_change_group=checks.ddp_change_group, ddp_change=checks.ddp_change)


def _age(now: float, stamp: float) -> float | None:
    """Seconds since a beacon's time stamp; None for none (0) or one that is no time at all."""
    return max(0.0, now - stamp) if stamp > 0 and math.isfinite(stamp) else None
