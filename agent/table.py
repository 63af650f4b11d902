"""The agent's table of training processes on this node: beacons, liveness, exits.

A worker is *verified* when its process runs as the beacon's owner, started before the beacon
was made, holds the beacon mapped or open, and has the beacon's RANK and WORLD_SIZE in its
environment (`agent.verify`; a rank torch.multiprocessing.spawn started has no RANK there: it
became the rank when it called init_process_group, in the process that holds the beacon). Only
verified workers enter the table, so only they are reported, handed to py-spy or have their
files read; a beacon that fails is remembered (so it is not examined again until it changes)
and logged once (`agent.discover`). Torchrun workers without a hook are taken when they and
their torchrun run as one user and their environment names this table's beacon directory
(`agent.unhooked`). Exits are noticed here and explained by the worker itself
(`Worker.note_exit`); exited workers are forgotten after a while (`agent.retention`). Each
refresh also observes every worker's process (`Worker.observe`), so that `agent.rankstate`
converts without reading. The table is refreshed in a thread, off the agent's event loop: every
access holds its lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from agent import beaconfiles, exits, procfs, retention, unhooked
from agent.discover import BeaconDiscovery
from agent.worker import Worker
from watchdog.errors import BeaconError
from watchdog.text import printable

log = logging.getLogger(__name__)


class WorkerTable:
    def __init__(self, beacon_dir: str, scan_unhooked: bool = True, proc: str = "/proc",
                 observer: exits.ExitObserver | None = None) -> None:
        self.beacon_dir = beacon_dir
        self._scan_unhooked = scan_unhooked
        self._proc = proc
        self.exits = observer or exits.ExitObserver(None, None)
        self._boot = procfs.boot_time(proc)
        self._lock = threading.Lock()
        self._discovery = BeaconDiscovery(proc, self._boot)
        self._by_path: dict[str, Worker] = {}
        self._unhooked: dict[int, Worker] = {}
        self._last_unhooked_scan = 0.0

    def close_exits(self) -> None:
        """Read no more exits: a scan still running in its thread (a stopping daemon's) finds
        none to read, instead of closed sources. It waits for that scan's pass: call it off the
        event loop."""
        with self._lock:
            self.exits.close()
            self.exits = exits.ExitObserver(None, None)

    def workers(self) -> list[Worker]:
        with self._lock:
            return self._all()

    def _all(self) -> list[Worker]:
        return [*self._by_path.values(), *self._unhooked.values()]

    def refresh(self, now: float, gpu: Mapping[int, float] | None = None) -> None:
        """One pass: new beacons, fresh snapshots, exits, then each worker's process observed
        (`gpu` maps pids to their GPU utilisation). Errors are per worker, never fatal."""
        found = {f.path: f for f in beaconfiles.scan(self.beacon_dir)}
        with self._lock:
            for worker in self._discovery.new_workers(found, self._by_path, now):
                self._unhooked.pop(worker.identity.pid, None)
                self._by_path[worker.beacon_path] = worker
            self.exits.drain({w.identity.pid for w in self._all()})
            for worker in list(self._by_path.values()):
                self._update(worker, now)
            if self._scan_unhooked and now - self._last_unhooked_scan >= unhooked.SCAN_S:
                self._last_unhooked_scan = now
                self._scan_proc(now)
            for worker in self._all():
                if not worker.alive and worker.exit_status is None:
                    worker.learn_how(self.exits)
            retention.forget_old(self._by_path, self._unhooked, now)
            for worker in self._all():
                worker.observe(now, (gpu or {}).get(worker.identity.pid), self._proc)

    def find(self, job_id: str, rank: int) -> Worker | None:
        for worker in self.workers():
            if worker.identity.job_id == job_id and worker.identity.rank == rank:
                return worker
        return None

    def _update(self, worker: Worker, now: float) -> None:
        self._read(worker)
        self._check_exit(worker, now)

    def _read(self, worker: Worker) -> None:
        if worker.fd is not None:
            try:
                worker.snapshot = beaconfiles.read(worker.fd)
                worker.unreadable = False
            except (BeaconError, OSError) as e:
                # Said once until it reads well again: its owner may keep it unreadable.
                if worker.alive and not worker.unreadable:
                    log.warning("rank %d of %s: %s", worker.identity.rank,
                                printable(worker.identity.job_id), str(e).split("\n")[0])
                worker.unreadable = True

    def _scan_proc(self, now: float) -> None:
        known = {w.identity.pid for w in self._by_path.values()} | self._unhooked.keys()
        for worker in unhooked.find(self._proc, self._boot, known, self.beacon_dir):
            self._unhooked[worker.identity.pid] = worker
        for worker in list(self._unhooked.values()):
            self._check_exit(worker, now)

    def _check_exit(self, worker: Worker, now: float) -> None:
        if worker.alive and not worker.still_running(self._proc):
            # Its hook's last publish (a clean exit, its code) may have come after this pass
            # read the beacon: read once more, now that nothing writes it.
            self._read(worker)
            worker.note_exit(now, self.exits)
