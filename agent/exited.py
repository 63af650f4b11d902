"""When and how a worker of the table ended: its process gone or replaced, timed by its beacon,
the kernel's event or the scan that noticed, and its exit status and OOM kill from what the
exit observer (`agent.exits`) and its memory cgroup showed."""

from __future__ import annotations

import logging

from agent import exits, procfs
from agent.worker import Worker
from watchdog import beacon
from watchdog.text import printable

log = logging.getLogger(__name__)


def still_running(worker: Worker, proc: str) -> bool:
    """Whether the worker's process runs (not one that took its pid since); notes the exit
    status of a zombie its parent has not reaped yet."""
    stat = procfs.read_stat(worker.identity.pid, proc)
    if stat is not None and stat.exit_status is not None:
        worker.exit_status = stat.exit_status
    return stat is not None and not stat.gone and (
        worker.start_ticks == 0 or stat.start_ticks == worker.start_ticks)


def note_exit(worker: Worker, now: float, observer: exits.ExitObserver) -> None:
    """Note the exit, timed by the beacon where the hook recorded it, else by the kernel's
    event where one showed it, else now."""
    learn_how(worker, observer)
    snap = worker.snapshot
    event = _exit_event(worker, observer)
    if snap is not None and snap.exit_state != beacon.EXIT_RUNNING:
        worker.exited_at = snap.exited_at
    else:
        worker.exited_at = event[1] if event is not None else now
    ident = worker.identity
    log.info("rank %d of job %s (pid %d) exited", ident.rank, printable(ident.job_id),
             ident.pid)


def watch_oom(worker: Worker, proc: str) -> None:
    """Find the worker's cgroup's OOM kill counter, and its count now, to compare at its exit."""
    worker.oom_counter = exits.oom_counter_path(worker.identity.pid, proc)
    worker.oom_kills = exits.oom_kills(worker.oom_counter) if worker.oom_counter else None


def learn_how(worker: Worker, observer: exits.ExitObserver) -> None:
    """How an exited worker ended, from what the observer saw since: its exit status, and
    whether the OOM killer killed it (its record, or its cgroup's count gone up). A count
    gone up also tells of a rank that raised because the OOM killer killed its DataLoader
    worker, a process of its cgroup: its exception then carries oom_killed."""
    event = _exit_event(worker, observer)
    if event is not None:
        worker.exit_status = event[0]
    if observer.oom_killed(worker.identity.pid, since=worker.identity.created_at):
        worker.oom_killed = True
    elif worker.oom_counter and worker.oom_kills is not None:
        now_kills = exits.oom_kills(worker.oom_counter)
        worker.oom_killed = now_kills is not None and now_kills > worker.oom_kills


def _exit_event(worker: Worker, observer: exits.ExitObserver) -> tuple[int, float] | None:
    """The kernel's record of this worker's exit; not that of an earlier process that had
    its pid."""
    event = observer.status(worker.identity.pid)
    return event if event is not None and event[1] >= worker.identity.created_at - 2.0 else None
