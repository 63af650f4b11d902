"""The agent's table of training processes on this node: beacons, liveness, exits.

A worker is *verified* when its process runs as the beacon's owner, started before the beacon
was made, holds the beacon mapped or open, and has the beacon's RANK and WORLD_SIZE in its
environment (`agent.verify`; a rank torch.multiprocessing.spawn started has no RANK there: it
became the rank when it called init_process_group, in the process that holds the beacon). Only
verified workers enter the table, so only they are reported, handed to py-spy or have their
files read; a beacon that fails is remembered (so it is not examined again until it changes)
and logged once. Torchrun workers without a hook are taken when they and their torchrun run as
one user. The table is refreshed in a thread, off the agent's event loop: every access holds
its lock.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from agent import activity, beaconfiles, exits, procfs, verify
from agent.logtail import expand_nccl_debug_file
from watchdog import beacon
from watchdog import env as _env
from watchdog.errors import BeaconError
from watchdog.model import (
    NO_ACTIVITY,
    NO_EVIDENCE,
    Activity,
    CheckEvidence,
    ExitReason,
    Frame,
    GroupProgress,
    RankState,
)
from watchdog.text import printable

log = logging.getLogger(__name__)

STALE_BEACON_S = 60.0  # a beacon whose process died this long ago belongs to an old job
EXITED_RETENTION_S = 300.0  # keep reporting an exited worker this long, then forget it
UNHOOKED_SCAN_S = 2.0
# Reports that carry a rank's fingerprints after it took a new one: a few, in case one is shed
# on the way; every report would double the coordinator's cost of decoding a rank's state.
FINGERPRINT_REPORTS = 5


@dataclass
class Worker:
    """A verified training process."""

    identity: beacon.Identity  # from its beacon, or from its environment without a hook
    start_ticks: int
    beacon_path: str = ""  # empty: a torchrun worker without the hook (stacks only)
    nccl_debug_file: str = ""  # NCCL_DEBUG_FILE with %h and %p expanded, if the worker set it
    master_addr: str = ""  # the job's rendezvous host: where its coordinator runs by default
    fd: int | None = None  # the beacon, open read-only
    snapshot: beacon.BeaconSnapshot | None = None
    exited_at: float | None = None
    window: activity.ActivityWindow = field(default_factory=activity.ActivityWindow)
    exit_status: int | None = None  # as waitpid reports it, where the agent could see it
    oom_counter: str = ""  # the file counting OOM kills in its memory cgroup...
    oom_kills: int | None = None  # ...and the count when it was found
    oom_killed: bool = False
    fingerprints_taken: int = 0  # how many the beacon said its rank had taken, last report
    fingerprint_reports: int = 0  # reports that still carry them
    owner: verify.Credentials | None = None  # its files are read with these credentials
    found: beaconfiles.Found | None = None  # where its beacon was found

    @property
    def alive(self) -> bool:
        return self.exited_at is None

    def sample(self, now: float, stat: procfs.ProcStat, gpu_util: float | None) -> Activity:
        """Read the process's counters; its activity over the last few seconds."""
        return self.window.add(activity.read(self.identity.pid, now, stat), gpu_util)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class WorkerTable:
    def __init__(self, beacon_dir: str, scan_unhooked: bool = True, proc: str = "/proc",
                 observer: exits.ExitObserver | None = None) -> None:
        self.beacon_dir = beacon_dir
        self._scan_unhooked = scan_unhooked
        self._proc = proc
        self.exits = observer or exits.ExitObserver(None, None)
        self._boot = procfs.boot_time(proc)
        self._lock = threading.Lock()
        self._by_path: dict[str, Worker] = {}
        self._unhooked: dict[int, Worker] = {}
        # Beacons refused, by path, with the file's signature then: looked at again on change.
        self._refused: dict[str, tuple[int, int, int]] = {}
        self._refused_before: set[str] = set()  # already logged
        self._last_unhooked_scan = 0.0

    def workers(self) -> list[Worker]:
        with self._lock:
            return self._all()

    def _all(self) -> list[Worker]:
        return [*self._by_path.values(), *self._unhooked.values()]

    def refresh(self, now: float) -> None:
        """One pass: new beacons, fresh snapshots, exits. Errors are per worker, never fatal."""
        found = {f.path: f for f in beaconfiles.scan(self.beacon_dir)}
        with self._lock:
            self._refused = {path: signature for path, signature in self._refused.items()
                             if path in found and found[path].signature == signature}
            self._refused_before &= found.keys()
            for path, entry in sorted(found.items()):
                if path not in self._by_path and path not in self._refused:
                    self._discover(entry, now)
            self.exits.drain({w.identity.pid for w in self._all()})
            for worker in list(self._by_path.values()):
                self._update(worker, now)
            if self._scan_unhooked and now - self._last_unhooked_scan >= UNHOOKED_SCAN_S:
                self._last_unhooked_scan = now
                self._scan_proc(now)
            for worker in self._all():
                if not worker.alive and worker.exit_status is None:
                    self._learn_exit(worker)
            self._forget_old(now)

    def find(self, job_id: str, rank: int) -> Worker | None:
        for worker in self.workers():
            if worker.identity.job_id == job_id and worker.identity.rank == rank:
                return worker
        return None

    def _refuse(self, found: beaconfiles.Found, why: str) -> None:
        """Remember a refused beacon until it changes; say so once per file."""
        level = logging.DEBUG if found.path in self._refused_before else logging.WARNING
        log.log(level, "ignoring %s: %s", printable(found.path), printable(why))
        self._refused[found.path] = found.signature
        self._refused_before.add(found.path)

    def _discover(self, found: beaconfiles.Found, now: float) -> None:
        try:
            fd, st = beaconfiles.open_beacon(found)
        except BeaconError as e:
            self._refuse(found, str(e).split("\n")[0])
            return
        try:
            snap = beaconfiles.read(fd)
        except (BeaconError, OSError) as e:
            os.close(fd)
            self._refuse(found, str(e).split("\n")[0])
            return
        ident = snap.identity
        stat = procfs.read_stat(ident.pid, self._proc)
        last_sign_of_life = max(snap.heartbeat, snap.exited_at)
        if (stat is None or stat.gone) and now - last_sign_of_life > STALE_BEACON_S:
            os.close(fd)
            # Left behind by a job that ended while no agent watched (or killed with SIGKILL).
            if not beaconfiles.remove(found):
                self._refuse(found, "its process is gone, and the file is not ours to remove")
            return
        why = _impossible(ident) or verify.refuse_beacon_writer(
            ident.pid, st, ident.created_at, self._boot, self._proc)
        env = None if why else procfs.read_environ(ident.pid, self._proc)
        why = why or verify.refuse_environment(env, ident.rank, ident.world_size)
        if why:
            os.close(fd)
            self._refuse(found, f"not a verified worker: {why}")
            return
        worker = Worker(ident, stat.start_ticks if stat else 0, found.path,
                        _nccl_debug_file(env, ident.pid), (env or {}).get("MASTER_ADDR", ""),
                        fd, snap, owner=verify.credentials(ident.pid, self._proc), found=found)
        self._watch_oom(worker)
        self._unhooked.pop(ident.pid, None)
        self._by_path[found.path] = worker
        log.info("tracking rank %d of job %s (pid %d)", ident.rank, printable(ident.job_id),
                 ident.pid)

    def _update(self, worker: Worker, now: float) -> None:
        if worker.fd is not None:
            try:
                worker.snapshot = beaconfiles.read(worker.fd)
            except (BeaconError, OSError) as e:
                if worker.alive:
                    log.warning("rank %d of %s: %s", worker.identity.rank,
                                printable(worker.identity.job_id), str(e).split("\n")[0])
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
        log.info("rank %d of job %s (pid %d) exited", ident.rank, printable(ident.job_id),
                 ident.pid)

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
        whether the OOM killer killed it (its record, or its cgroup's count gone up). A count
        gone up also tells of a rank that raised because the OOM killer killed its DataLoader
        worker, a process of its cgroup: its exception then carries oom_killed."""
        pid = worker.identity.pid
        event = self._exit_event(worker)
        if event is not None:
            worker.exit_status = event[0]
        if self.exits.oom_killed(pid, since=worker.identity.created_at):
            worker.oom_killed = True
        elif worker.oom_counter and worker.oom_kills is not None:
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
        """A torchrun worker without a hook. It is the user's own process (it and its torchrun
        run as one user, no setuid), so attaching to it or reading its files as that user
        does nothing its owner could not."""
        stat = procfs.read_stat(pid, self._proc)
        if stat is None or stat.gone or not procfs.is_torchrun(
                procfs.read_cmdline(stat.ppid, self._proc)):
            return None
        owner = verify.credentials(pid, self._proc)
        launcher = verify.credentials(stat.ppid, self._proc)
        if owner is None or launcher is None or launcher.uid != owner.uid:
            return None
        env = procfs.read_environ(pid, self._proc)
        if env is None or not _env.is_torchrun_worker(env) or env.get(_env.AUTOINSTALL) == "1":
            return None  # not a worker, or a hooked one: its beacon (here or elsewhere) tells
        identity = beacon.Identity(
            _env.job_id(env), _env.int_env(env, "RANK", 0), _env.int_env(env, "LOCAL_RANK", 0),
            _env.int_env(env, "WORLD_SIZE", 1), _env.short_hostname(), pid,
            procfs.start_time(stat, self._boot), _env.int_env(env, _env.ATTEMPT, 0))
        if _impossible(identity):
            return None
        worker = Worker(identity, stat.start_ticks, nccl_debug_file=_nccl_debug_file(env, pid),
                        master_addr=env.get("MASTER_ADDR", ""), owner=owner)
        self._watch_oom(worker)
        return worker

    def _forget_old(self, now: float) -> None:
        def expired(worker: Worker) -> bool:
            return worker.exited_at is not None and now - worker.exited_at > EXITED_RETENTION_S

        for pid in [pid for pid, w in self._unhooked.items() if expired(w)]:
            del self._unhooked[pid]
        for path in [path for path, w in self._by_path.items() if expired(w)]:
            worker = self._by_path.pop(path)
            worker.close()
            if worker.found is not None:
                beaconfiles.remove(worker.found)


def _impossible(ident: beacon.Identity) -> str:
    """Why an identity cannot be a rank of any job (the coordinator would refuse the whole
    report that carried it); "" when it can."""
    if not ident.job_id:
        return "no job id"
    if not 0 < ident.world_size <= beacon.MAX_WORLD or not 0 <= ident.rank < ident.world_size:
        return f"rank {ident.rank} of world size {ident.world_size}"
    if not -1 <= ident.local_rank < beacon.MAX_WORLD:
        return f"local rank {ident.local_rank}"
    return ""


def _members(ranks: tuple[int, ...], world_size: int) -> tuple[int, ...]:
    """A group of the whole world goes out as (): every report would otherwise carry
    world_size ranks per rank, 16k x 16k integers a second at scale. The coordinator reads ()
    as the world for group 0, and as the ranks reporting the group for any other."""
    return () if len(ranks) == world_size else ranks


def _nccl_debug_file(env: dict[str, str] | None, pid: int) -> str:
    pattern = (env or {}).get("NCCL_DEBUG_FILE", "")
    return expand_nccl_debug_file(pattern, _env.short_hostname(), pid) if pattern else ""


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
        progress_age=_age(now, snap.progress_at), pace=snap.pace,
        steps=snap.steps, events=snap.events, last_event_at=snap.last_event_at,
        groups=tuple(GroupProgress(g.name, _members(g.ranks, ident.world_size), g.entered_seq,
                                   g.op, g.completed_seq, g.entered_at) for g in snap.groups),
        phase=snap.phase, phase_age=now - snap.phase_started if snap.phase else 0.0,
        phase_timeout=snap.phase_timeout,
        exit_code=snap.exit_code if hook_saw_exit else base.exit_code,
        clean_exit=snap.exit_state == beacon.EXIT_CLEAN,
        exit_reason=_raised(snap.raised, worker.oom_killed) if hook_saw_exit and snap.raised
        else base.exit_reason,
        setup=setup.call, setup_age=_age(now, setup.entered_at) if setup.call else None,
        rendezvous=setup.rendezvous,
        evidence=check_evidence(snap.checks, _new_fingerprints(worker, snap.checks)))


def _raised(raised: beacon.RaisedException, oom_killed: bool) -> ExitReason:
    return ExitReason(exception=raised.type, message=raised.message,
                      frames=tuple(Frame(function, file, line)
                                   for function, file, line in raised.frames),
                      oom_killed=oom_killed)


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
        fingerprints=checks.fingerprints if fingerprints else (),
        unsynced_steps=checks.unsynced_steps, sampler_reuses=checks.sampler_reuses,
        sampler_reuse_step=checks.sampler_reuse_step, sampler_epoch=checks.sampler_epoch,
        ddp_change_step=checks.ddp_change_step, ddp_change_module=checks.ddp_change_module,
        ddp_change_group=checks.ddp_change_group, ddp_change=checks.ddp_change)


def _age(now: float, stamp: float) -> float | None:
    """Seconds since a beacon's time stamp; None for none (0) or one that is no time at all."""
    return max(0.0, now - stamp) if stamp > 0 and math.isfinite(stamp) else None
