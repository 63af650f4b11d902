"""The embedded mode of `watchdog run` and `watchdog demo` (CLI process): a coordinator and an
agent in one asyncio process beside the job.

They still talk gRPC, over a 0600 unix socket in the user's runs directory (where `watchdog
status` finds it; `discover`), so this path is the same code as the multi-process deployment.
The job's beacons go to a private (0700) run directory. What it sees of the job (which job,
how many ranks report, why none does, a notice's end) it says through `seen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from agent import procfs
from agent.daemon import Agent
from agent.worker import Worker
from watchdog import env as _env
from watchdog import metrics
from watchdog.atomic import write_atomically
from watchdog.coordinator import Coordinator, StallPolicy, store_for
from watchdog.coordinator.after_exit import StillHung
from watchdog.coordinator.database import Database, database_of
from watchdog.coordinator.gauges import keep_sampled
from watchdog.errors import ExitCode, WatchdogError
from watchdog.model import Kind
from watchdog.report import write_html
from watchdog.report.terminal import render_incident
from watchdog.schema import Incident, is_hang
from watchdog.supervise.framing import (
    Ended,
    RunEnd,
    db_option,
    ended_text,
    ending_text,
    next_steps_text,
)
from watchdog.supervise.inject import cannot_run, check_command, hook_env, new_job_id
from watchdog.supervise.runs_dir import claim_run_socket, own_runtime_dir
from watchdog.supervise.seen import (
    attempts_seen,
    moved_on_text,
    reached_distributed,
    say_what_it_sees,
    sighting,
)
from watchdog.text import printable
from watchdog.transport import start_server

log = logging.getLogger(__name__)

KILL_GRACE_S = 5.0
INTERVAL_S = 0.25


@dataclass(frozen=True)
class RunOptions:
    cmd: Sequence[str]
    policy: StallPolicy
    on_hang: str = "report"  # or "kill", or "restart"
    report_path: str | None = None
    report_html: str | None = None  # the first hang incident as an HTML page
    database: Database = field(default_factory=lambda: database_of(None))
    color: bool = False
    native: bool = False  # py-spy --native stacks
    job_log: str | None = None  # where the job's stdout and stderr go; None: ours
    metrics_listen: str | None = None  # HOST:PORT for Prometheus; None: no metrics served
    time_limit: float | None = None  # end a job still running after this many seconds
    framed: bool = False  # say what to do after a hang, and how the run ended (`watchdog run`)


def write_report(path: str, incident: Incident) -> None:
    write_atomically(path, json.dumps(incident, indent=2) + "\n")


class _Run:
    def __init__(self, options: RunOptions, out: TextIO, agent: Agent,
                 coordinator: Coordinator) -> None:
        self.options = options
        self.out = out
        self.agent = agent
        self.coordinator = coordinator
        self.incidents: list[Incident] = []
        self.kill = asyncio.Event()  # --on-hang kill: end the job
        self.reported = False  # the first hang went to --report and --report-html
        self.advised = False  # what to do next was said (--on-hang report)
        self.restarts: set[asyncio.Task[None]] = set()
        self.interrupted = False  # the user's Ctrl-C went to the job
        self.ended: list[Ended] = []  # what --on-hang kill or restart ended, in order

    def stop_judging(self, sig: int) -> None:
        """The user ends the job (a signal we passed on): its ranks' exits, KeyboardInterrupt
        above all, are that end, not a hang."""
        self.interrupted = self.interrupted or sig == signal.SIGINT
        for job_id in list(self.coordinator.jobs):
            self.coordinator.let_go(job_id)

    def on_incident(self, incident: Incident) -> None:
        """Every incident is printed once; only a hang (RANK_EXITED included) is the report,
        and only a hang ends the job (`kill`) or the attempt that hung (`restart`): a rank's
        exit is the launcher's to handle, acted on only if its peers still wait
        (`on_still_hung`)."""
        self.incidents.append(incident)
        self.out.write(render_incident(incident, color=self.options.color) + "\n")
        self.out.flush()
        if not is_hang(incident):
            return
        if not self.reported:
            self.reported = True
            if self.options.report_path:
                self._write("JSON report", self.options.report_path, incident, write_report)
            if self.options.report_html:
                self._write("HTML report", self.options.report_html, incident, write_html)
        if incident["kind"] != Kind.RANK_EXITED:
            self._act(incident)

    def on_still_hung(self, still: StillHung) -> None:
        """An exit's peers still wait a threshold later, and the launcher did not end them:
        the job is hung, and --on-hang acts as on a hang."""
        self._act(still.incident, still)

    def _act(self, incident: Incident, still: StillHung | None = None) -> None:
        """What --on-hang does for a hang, or for an exit whose peers `still` wait."""
        if self.options.on_hang == "report":
            if self.options.framed and not self.advised:
                self.advised = True
                self.out.write(next_steps_text(incident, str(self.options.database), still,
                                               db_option(self.options.database)) + "\n")
                self.out.flush()
            return
        ended = Ended(self.options.on_hang, incident, still)
        self.ended.append(ended)
        # What follows is that end, judged no more: the ranks' shutdown is no progress that
        # contradicts the verdict, and their exits no new incident.
        self.coordinator.let_go(incident["job_id"])
        if ended.action == "restart":
            self._end_attempt(ended)
        else:
            self.kill.set()

    @property
    def killed(self) -> Ended | None:
        """What --on-hang kill ended the job for, if it did."""
        return next((e for e in self.ended if e.action == "kill"), None)

    def on_ended(self, incident: Incident, lasted: float) -> None:
        """A notice ended, or a hang the job contradicted: said, and counted as it now is."""
        self.incidents = [incident if seen["id"] == incident["id"] else seen
                          for seen in self.incidents]
        self.out.write(moved_on_text(incident, lasted) + "\n")
        self.out.flush()

    def _write(self, what: str, path: str, incident: Incident,
               writer: Callable[[str, Incident], None]) -> None:
        """A report is a copy (the store and the terminal have the incident): --on-hang never
        waits on it, and a path that cannot be written (checked up front, but a directory can
        go away during a run) fails this write alone, in one line."""
        try:
            writer(path, incident)
        except Exception as e:
            log.debug("writing %s failed", path, exc_info=True)
            self.out.write(f"watchdog: cannot write the {what} to {path}: {e}\n")
        else:
            self.out.write(f"watchdog: wrote the {what} of incident "
                           f"{printable(incident['id'])} to {path}\n")
        self.out.flush()

    def _end_attempt(self, ended: Ended) -> None:
        """End the workers of the attempt that hung, and not torchrun, which then starts the
        next attempt while it has restarts left (--max-restarts), or fails the job."""
        job_id = ended.incident["job_id"]
        workers = [w for w in self.agent.table.workers()
                   if w.alive and w.identity.job_id == job_id]
        what = f"the {len(workers)} workers of {job_id} so that torchrun restarts them"
        self.out.write(ending_text(ended, what) + "\n")
        self.out.flush()
        task = asyncio.get_running_loop().create_task(_end_workers(workers))
        self.restarts.add(task)
        task.add_done_callback(self.restarts.discard)


async def run_job(options: RunOptions, out: TextIO = sys.stderr,
                  incidents: list[Incident] | None = None) -> int:
    """Run the job under watch; the job's exit code, or 3 when a hang (or the time limit) made
    us end it. Every incident is printed, and appended to `incidents` where given."""
    cmd = check_command(options.cmd)
    run_dir = private_run_dir()
    store = store_for(options.database, coordinator=f"{_env.short_hostname()} (watchdog run)")
    try:
        store.open()
    except WatchdogError as e:
        out.write(f"watchdog: {str(e).splitlines()[0]}; incidents are printed, and stored once "
                  "it opens\n")
    coordinator = Coordinator(store, options.policy, tick=INTERVAL_S)
    # In the runs directory, `watchdog status` finds it; where that cannot be, in our own.
    socket_path = claim_run_socket(os.getpid()) or f"{run_dir}/coordinator.sock"
    address = f"unix:{socket_path}"
    server, _ = await start_server(coordinator, address)
    os.chmod(socket_path, 0o600)
    agent = Agent(address, run_dir, _env.short_hostname(), INTERVAL_S,
                  scan_unhooked=False, native=options.native)
    state = _Run(options, out, agent, coordinator)
    coordinator.listeners.append(state.on_incident)
    coordinator.ended_listeners.append(state.on_ended)
    coordinator.still_hung_listeners.append(state.on_still_hung)
    if incidents is not None:
        coordinator.listeners.append(incidents.append)
    stop = asyncio.Event()
    daemons = [asyncio.create_task(coordinator.run(stop)), asyncio.create_task(agent.run(stop))]
    exporter = metrics.serve(options.metrics_listen) if options.metrics_listen else None
    if exporter is not None:
        daemons.append(asyncio.create_task(keep_sampled(coordinator, stop)))
        out.write(f"watchdog: metrics at {exporter.url}\n")
    try:
        job_id = os.environ.get(_env.JOB_ID) or new_job_id(cmd)
        # The job keeps its own descriptor of the log: ours can close once it started.
        proc = await _start_job(cmd, hook_env(os.environ, run_dir, job_id), options.job_log)
        workers = functools.partial(_live_workers, agent)
        _forward_signals(proc.pid, workers, out, state.stop_judging)
        seeing = asyncio.create_task(say_what_it_sees(
            coordinator.jobs.values, proc.pid, options.policy, out, INTERVAL_S))
        started = time.monotonic()
        try:
            code = await _wait_job(proc, state, workers)
        finally:
            seeing.cancel()
        # The job is gone: one last look so an exit in its final moments is still diagnosed.
        report = await asyncio.to_thread(agent.scan)
        coordinator.ingest(report, report.sent_at)
        coordinator.evaluate_all(report.sent_at)
        await coordinator.settled()
        if state.interrupted and code != ExitCode.HANG_KILLED:
            code = ExitCode.INTERRUPTED
        if options.framed:
            jobs = list(coordinator.jobs.values())
            out.write(ended_text(RunEnd(
                code, time.monotonic() - started, state.incidents, str(options.database),
                sighting(jobs) is not None, reached_distributed(jobs), state.interrupted,
                state.ended, attempts_seen(jobs), db_option(options.database),
                await coordinator.saver.settle())) + "\n")
        return code
    finally:
        stop.set()
        await asyncio.gather(*daemons, return_exceptions=True)
        await server.stop(grace=1.0)
        if exporter is not None:
            exporter.close()
        await coordinator.saver.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        shutil.rmtree(run_dir, ignore_errors=True)


async def _start_job(cmd: Sequence[str], env: Mapping[str, str],
                     job_log: str | None) -> asyncio.subprocess.Process:
    """The job, in a session of its own; its output to `job_log` where given."""
    # The job keeps its own descriptor of the log: ours can close once it started.
    with open(job_log, "w") if job_log else contextlib.nullcontext() as output:
        try:
            return await asyncio.create_subprocess_exec(
                *cmd, env=env, start_new_session=True,
                stdout=output, stderr=asyncio.subprocess.STDOUT if output else None)
        except OSError as e:
            raise cannot_run(cmd[0], e) from e


def private_run_dir(env: Mapping[str, str] = os.environ) -> str:
    """A new directory only this user can enter, for the socket and the job's beacons: under
    $XDG_RUNTIME_DIR when it is this user's own 0700 directory, else in /dev/shm or the
    temporary directory (sticky: nobody else can rename or replace what we make there)."""
    parent = own_runtime_dir(env) or (
        "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    return tempfile.mkdtemp(prefix="torch-hang-watchdog-run-", dir=parent)


def _live_workers(agent: Agent) -> list[Worker]:
    return [w for w in agent.table.workers() if w.alive]


async def _end_workers(workers: list[Worker]) -> None:
    """SIGTERM, then SIGKILL to those the agent still sees alive after the grace period."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 0.0)):
        for worker in workers:
            if worker.alive:
                signal_worker(worker, sig)
        await asyncio.sleep(grace)


async def _wait_job(proc: asyncio.subprocess.Process, state: _Run,
                    live_workers: Callable[[], list[Worker]]) -> int:
    exited = asyncio.create_task(proc.wait())
    kill = asyncio.create_task(state.kill.wait())
    await asyncio.wait({exited, kill}, return_when=asyncio.FIRST_COMPLETED,
                       timeout=state.options.time_limit)
    kill.cancel()
    if not exited.done():
        killed = state.killed
        state.out.write((
            f"watchdog: ending the job, still running after {state.options.time_limit:.0f} s"
            if killed is None else
            ending_text(killed, "the job" if killed.still is not None else "the hung job")) + "\n")
        await _kill_job(proc, exited, live_workers())
        return ExitCode.HANG_KILLED
    code = exited.result()
    return 128 - code if code < 0 else code


async def _kill_job(proc: asyncio.subprocess.Process, exited: asyncio.Task[int],
                    workers: list[Worker]) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        _signal_job(proc.pid, workers, sig)
        done, _ = await asyncio.wait({exited}, timeout=wait)
        if done:
            return


def _signal_job(pgid: int, workers: list[Worker], sig: int) -> None:
    """torchrun puts each worker in a session of its own: signal them as well as torchrun, and
    their groups, where they lead one, with their DataLoader workers in it (a worker blocked in
    a read never notices its rank died, and would outlive the job)."""
    _signal_group(pgid, sig)
    for worker in workers:
        signal_worker(worker, sig)


def signal_worker(worker: Worker, sig: int) -> None:
    """A worker and the group it leads, if any, while its pid names the process the agent found
    (the pid of one that exited may be another's by now): a group with the id of the worker's
    pid can then only be the one that worker made."""
    pid = worker.identity.pid
    if procfs.read_stat_of(pid, worker.start_ticks) is None:
        log.info("not signalling pid %d: rank %d's process has exited", pid,
                 worker.identity.rank)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _forward_signals(pgid: int, workers: Callable[[], list[Worker]], out: TextIO,
                     first: Callable[[int], None]) -> None:
    """Ctrl-C and SIGTERM reach the job (it runs in its own session) instead of killing us, and
    `first` hears of the first. A second one kills the job outright: whoever presses Ctrl-C
    again wants it gone now, not after torchrun's own grace period."""
    loop = asyncio.get_running_loop()
    received = 0

    def forward(sig: int) -> None:
        nonlocal received
        received += 1
        if received == 1:
            first(sig)
            _signal_group(pgid, sig)
        else:
            out.write("watchdog: second signal: killing the job\n")
            _signal_job(pgid, workers(), signal.SIGKILL)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, forward, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
