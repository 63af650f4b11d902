"""One verified training process as the agent's table holds it, and what the table last observed
of it: its process's state and activity, read at each refresh, so that converting it to a
report entry (`agent.rankstate`) reads nothing; and when and how it ended: its process gone or
replaced, timed by its beacon, the kernel's event or the scan that noticed, its exit status and
OOM kill from what the exit observer (`agent.exits`) and its memory cgroup showed."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from agent import activity, beaconfiles, exits, procfs, verify
from watchdog import beacon
from watchdog.model import NO_ACTIVITY, Activity
from watchdog.text import printable

log = logging.getLogger(__name__)

# Reports that carry a rank's fingerprints after it took a new one (or its environment after
# its hook recorded it): a few, in case one is shed on the way; every report would double the
# coordinator's cost of decoding a rank's state.
FINGERPRINT_REPORTS = 5


@dataclass
class FewReports:
    """Whether the next report carries a record of the rank: one of the next few after the
    record changed."""

    last: object = None
    left: int = 0

    def due(self, record: object) -> bool:
        if record != self.last:
            self.last, self.left = record, FINGERPRINT_REPORTS
        if self.left <= 0:
            return False
        self.left -= 1
        return True


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
    unreadable: bool = False  # its beacon's last read failed (and that was said)
    exited_at: float | None = None
    window: activity.ActivityWindow = field(default_factory=activity.ActivityWindow)
    exit_status: int | None = None  # as waitpid reports it, where the agent could see it
    oom_counter: str = ""  # the file counting OOM kills in its memory cgroup...
    oom_kills: int | None = None  # ...and the count when it was found
    oom_killed: bool = False
    # what the beacon said of how many fingerprints its rank had taken, and of its environment
    fingerprints: FewReports = field(default_factory=lambda: FewReports(0))
    environment: FewReports = field(default_factory=lambda: FewReports(beacon.NO_ENVIRONMENT))
    owner: verify.Credentials | None = None  # its files are read with these credentials
    found: beaconfiles.Found | None = None  # where its beacon was found
    # What the last refresh observed, for the next report:
    proc_state: str = ""  # its /proc state letter; "" once exited
    activity: Activity = NO_ACTIVITY
    carries_fingerprints: bool = False  # the next report carries its rank's fingerprints
    carries_environment: bool = False  # ...and its environment

    @property
    def alive(self) -> bool:
        return self.exited_at is None

    def observe(self, now: float, gpu_util: float | None, proc: str = "/proc") -> None:
        """Read the process's state and counters (its activity over the last few seconds), and
        count one more report toward the few that carry new fingerprints or a new environment."""
        stat = procfs.read_stat(self.identity.pid, proc) if self.alive else None
        self.proc_state = stat.state if stat is not None else ""
        progress_at = self.snapshot.progress_at if self.snapshot is not None else 0.0
        self.activity = (self.window.add(activity.read(self.identity.pid, now, stat, proc),
                                         gpu_util, progress_at)
                         if stat is not None and not stat.gone else NO_ACTIVITY)
        if self.snapshot is not None:
            self.carries_fingerprints = self.fingerprints.due(self.snapshot.checks.taken)
            self.carries_environment = self.environment.due(self.snapshot.environment)

    def still_running(self, proc: str) -> bool:
        """Whether its process runs (not one that took its pid since); notes the exit status of
        a zombie its parent has not reaped yet."""
        stat = procfs.read_stat(self.identity.pid, proc)
        if stat is not None and stat.exit_status is not None:
            self.exit_status = stat.exit_status
        return stat is not None and not stat.gone and (
            self.start_ticks == 0 or stat.start_ticks == self.start_ticks)

    def note_exit(self, now: float, observer: exits.ExitObserver) -> None:
        """Note the exit, timed by the beacon where the hook recorded it, else by the kernel's
        event where one showed it, else now."""
        self.learn_how(observer)
        snap = self.snapshot
        event = self._exit_event(observer)
        if snap is not None and snap.exit_state != beacon.EXIT_RUNNING:
            self.exited_at = snap.exited_at
        else:
            self.exited_at = event[1] if event is not None else now
        ident = self.identity
        log.info("rank %d of job %s (pid %d) exited", ident.rank, printable(ident.job_id),
                 ident.pid)

    def watch_oom(self, proc: str) -> None:
        """Find its cgroup's OOM kill counter, and its count now, to compare at its exit."""
        self.oom_counter = exits.oom_counter_path(self.identity.pid, proc)
        self.oom_kills = exits.oom_kills(self.oom_counter) if self.oom_counter else None

    def learn_how(self, observer: exits.ExitObserver) -> None:
        """How it ended, from what the observer saw since: its exit status, and whether the OOM
        killer killed it (its record, or its cgroup's count gone up). A count gone up also tells
        of a rank that raised because the OOM killer killed its DataLoader worker, a process of
        its cgroup: its exception then carries oom_killed."""
        event = self._exit_event(observer)
        if event is not None:
            self.exit_status = event[0]
        if observer.oom_killed(self.identity.pid, since=self.identity.created_at):
            self.oom_killed = True
        elif self.oom_counter and self.oom_kills is not None:
            now_kills = exits.oom_kills(self.oom_counter)
            self.oom_killed = now_kills is not None and now_kills > self.oom_kills

    def _exit_event(self, observer: exits.ExitObserver) -> tuple[int, float] | None:
        """The kernel's record of this process's exit; not that of an earlier process that had
        its pid."""
        event = observer.status(self.identity.pid)
        return event if event is not None and event[1] >= self.identity.created_at - 2.0 else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
