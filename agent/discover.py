"""New beacons in the beacon directory, each taken as a worker only once its writer is verified
(`agent.verify`); a beacon refused is remembered, so it is examined again only when it changes,
and said once. A beacon whose process died long ago is removed.

Anyone can write a beacon, claiming any world and any groups: only its fixed head (who wrote
it, when it last lived) is decoded before its writer is verified and its world found possible;
the rest, after.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Container, Mapping

from agent import beaconfiles, procfs, verify
from agent.logtail import expand_nccl_debug_file
from agent.worker import Worker
from watchdog import beacon
from watchdog import env as _env
from watchdog.errors import BeaconError
from watchdog.text import printable

log = logging.getLogger(__name__)

STALE_BEACON_S = 60.0  # a beacon whose process died this long ago belongs to an old job


class BeaconDiscovery:
    """The beacons examined so far: those refused, by path, with the file's signature then."""

    def __init__(self, proc: str, boot: float) -> None:
        self._proc = proc
        self._boot = boot
        self._refused: dict[str, tuple[int, int, int]] = {}
        self._refused_before: set[str] = set()  # already logged

    def new_workers(self, found: Mapping[str, beaconfiles.Found], known: Container[str],
                    now: float) -> list[Worker]:
        """The verified workers of the beacons found (by path) that are not `known` yet."""
        self._refused = {path: signature for path, signature in self._refused.items()
                         if path in found and found[path].signature == signature}
        self._refused_before &= found.keys()
        workers = []
        for path, entry in sorted(found.items()):
            if path not in known and path not in self._refused:
                worker = self._examine(entry, now)
                if worker is not None:
                    workers.append(worker)
        return workers

    def _refuse(self, found: beaconfiles.Found, why: str, level: int = logging.WARNING) -> None:
        """Remember a refused beacon until it changes; say so once per file."""
        level = logging.DEBUG if found.path in self._refused_before else level
        log.log(level, "ignoring %s: %s", printable(found.path), printable(why))
        self._refused[found.path] = found.signature
        self._refused_before.add(found.path)

    def _examine(self, found: beaconfiles.Found, now: float) -> Worker | None:
        try:
            fd, st = beaconfiles.open_beacon(found)
        except BeaconError as e:
            self._refuse(found, _first_line(e))
            return None
        try:
            worker = self._verified(found, fd, st, now)
        except (BeaconError, OSError) as e:
            worker = None
            self._refuse(found, _first_line(e))
        if worker is None:
            os.close(fd)
        return worker

    def _verified(self, found: beaconfiles.Found, fd: int, st: os.stat_result,
                  now: float) -> Worker | None:
        """The worker of the beacon open at `fd`; None once a stale beacon is removed, or when
        its process is gone; BeaconError when it is refused."""
        data = beaconfiles.copy(fd)
        head = beacon.read_head(data)
        ident = head.identity
        stat = procfs.read_stat(ident.pid, self._proc)
        if (stat is None or stat.gone) and now - max(head.heartbeat,
                                                     head.exited_at) > STALE_BEACON_S:
            # Left behind by a job that ended while no agent watched (or killed with SIGKILL).
            if beaconfiles.remove(found):
                return None
            raise BeaconError("its process is gone, and the file is not ours to remove")
        why = impossible(ident)
        if stat is None or stat.gone or (
                not why and head.exited_at and not verify.holds_file(ident.pid, st, self._proc)):
            # A rank that ended before the agent looked (a script that failed at once), or
            # that is ending: its exit recorded, the beacon let go, /proc not yet saying it is
            # gone. Nothing to watch, and nothing wrong with the beacon, so no warning on the
            # user's terminal; refused all the same (a beacon that says so proves nothing).
            self._refuse(found, f"process {ident.pid} ended before it was verified", logging.INFO)
            return None
        why = why or verify.refuse_beacon_writer(
            ident.pid, st, ident.created_at, self._boot, self._proc)
        env = None if why else procfs.read_environ(ident.pid, self._proc)
        why = why or verify.refuse_environment(env, ident.rank, ident.world_size)
        if why:
            raise BeaconError(f"not a verified worker: {why}")
        # Decoded whole only now: what an unverified writer claims costs the agent nothing.
        snap = beacon.read_beacon(data, attempts=1)
        worker = Worker(ident, stat.start_ticks if stat else 0, found.path,
                        nccl_debug_file(env, ident.pid), (env or {}).get("MASTER_ADDR", ""),
                        fd, snap, owner=verify.credentials(ident.pid, self._proc), found=found)
        worker.watch_oom(self._proc)
        log.info("tracking rank %d of job %s (pid %d)", ident.rank, printable(ident.job_id),
                 ident.pid)
        return worker


def _first_line(error: Exception) -> str:
    return str(error).split("\n")[0]


def impossible(ident: beacon.Identity) -> str:
    """Why an identity cannot be a rank of any job (the coordinator would refuse the whole
    report that carried it); "" when it can."""
    if not ident.job_id:
        return "no job id"
    if not 0 < ident.world_size <= beacon.MAX_WORLD or not 0 <= ident.rank < ident.world_size:
        return f"rank {ident.rank} of world size {ident.world_size}"
    if not -1 <= ident.local_rank < beacon.MAX_WORLD:
        return f"local rank {ident.local_rank}"
    return ""


def nccl_debug_file(env: Mapping[str, str] | None, pid: int) -> str:
    """The worker's NCCL_DEBUG_FILE, with %h and %p expanded; "" where it set none."""
    pattern = (env or {}).get("NCCL_DEBUG_FILE", "")
    return expand_nccl_debug_file(pattern, _env.short_hostname(), pid) if pattern else ""
