"""The embedded mode of `watchdog run` and `watchdog demo` (CLI process): a coordinator and an
agent in one asyncio process beside the job.

They still talk gRPC, over a 0600 unix socket in a private (0700) run directory, so this path is
the same code as the multi-process deployment; the job's beacons go there too.
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
import stat
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from agent.daemon import Agent
from watchdog import env as _env
from watchdog.cli.inject import check_command, hook_env, new_job_id
from watchdog.cli.render import render_incident
from watchdog.coordinator import Coordinator, IncidentStore, StallPolicy
from watchdog.errors import ExitCode, WatchdogError
from watchdog.transport import start_server

log = logging.getLogger(__name__)

KILL_GRACE_S = 5.0
INTERVAL_S = 0.25


@dataclass(frozen=True)
class RunOptions:
    cmd: Sequence[str]
    policy: StallPolicy
    on_hang: str = "report"  # or "kill"
    report_path: str | None = None
    db_path: str = ""
    color: bool = False
    native: bool = False  # py-spy --native stacks
    job_log: str | None = None  # where the job's stdout and stderr go; None: ours


def write_report(path: str, incident: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(incident, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


class _Run:
    def __init__(self, options: RunOptions, out: TextIO) -> None:
        self.options = options
        self.out = out
        self.incidents: list[dict[str, Any]] = []
        self.hang = asyncio.Event()

    def on_incident(self, incident: dict[str, Any]) -> None:
        self.incidents.append(incident)
        if self.options.report_path:
            write_report(self.options.report_path, incident)
        self.out.write(render_incident(incident, color=self.options.color) + "\n")
        self.out.flush()
        if self.options.on_hang == "kill":
            self.hang.set()


async def run_job(options: RunOptions, out: TextIO = sys.stderr) -> int:
    """Run the job under watch; the job's exit code, or 3 when a hang made us end it."""
    cmd = check_command(options.cmd)
    run_dir = private_run_dir()
    store = IncidentStore(options.db_path)
    try:
        store.open()
    except WatchdogError as e:
        out.write(f"watchdog: {str(e).splitlines()[0]}; incidents are printed, and stored once "
                  "it opens\n")
    state = _Run(options, out)
    coordinator = Coordinator(store, options.policy, tick=INTERVAL_S)
    coordinator.listeners.append(state.on_incident)
    address = f"unix:{run_dir}/coordinator.sock"
    server, _ = await start_server(coordinator, address)
    os.chmod(f"{run_dir}/coordinator.sock", 0o600)
    agent = Agent(address, run_dir, _env.short_hostname(), INTERVAL_S,
                  scan_unhooked=False, native=options.native)
    stop = asyncio.Event()
    daemons = [asyncio.create_task(coordinator.run(stop)), asyncio.create_task(agent.run(stop))]
    try:
        job_id = os.environ.get(_env.JOB_ID) or new_job_id(cmd)
        # The job keeps its own descriptor of the log: ours can close once it started.
        with open(options.job_log, "w") if options.job_log else contextlib.nullcontext() as output:
            proc = await asyncio.create_subprocess_exec(
                *cmd, env=hook_env(os.environ, run_dir, job_id), start_new_session=True,
                stdout=output, stderr=asyncio.subprocess.STDOUT if output else None)
        workers = functools.partial(_live_worker_pids, agent)
        _forward_signals(proc.pid, workers, out)
        code = await _wait_job(proc, state, workers)
        # The job is gone: one last look so an exit in its final moments is still diagnosed.
        report = await asyncio.to_thread(agent.scan)
        coordinator.ingest(report, report.sent_at)
        await asyncio.gather(*coordinator.evaluate_all(report.sent_at))
        return code
    finally:
        stop.set()
        await asyncio.gather(*daemons, return_exceptions=True)
        await server.stop(grace=1.0)
        await coordinator.saver.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def private_run_dir(env: Mapping[str, str] = os.environ) -> str:
    """A new directory only this user can enter, for the socket and the job's beacons: under
    $XDG_RUNTIME_DIR when it is this user's own 0700 directory, else in /dev/shm or the
    temporary directory (sticky: nobody else can rename or replace what we make there)."""
    runtime = env.get("XDG_RUNTIME_DIR", "")
    parent = runtime if runtime and _private(runtime) else (
        "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    return tempfile.mkdtemp(prefix="torch-hang-watchdog-run-", dir=parent)


def _private(directory: str) -> bool:
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def _live_worker_pids(agent: Agent) -> list[int]:
    return [w.identity.pid for w in agent.table.workers() if w.alive]


async def _wait_job(proc: asyncio.subprocess.Process, state: _Run,
                    worker_pids: Callable[[], list[int]]) -> int:
    exited = asyncio.create_task(proc.wait())
    hang = asyncio.create_task(state.hang.wait())
    await asyncio.wait({exited, hang}, return_when=asyncio.FIRST_COMPLETED)
    hang.cancel()
    if not exited.done():
        state.out.write("watchdog: ending the hung job (--on-hang kill)\n")
        await _kill_job(proc, exited, worker_pids())
        return ExitCode.HANG_KILLED
    code = exited.result()
    return 128 - code if code < 0 else code


async def _kill_job(proc: asyncio.subprocess.Process, exited: asyncio.Task[int],
                    workers: list[int]) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        _signal_job(proc.pid, workers, sig)
        done, _ = await asyncio.wait({exited}, timeout=wait)
        if done:
            return


def _signal_job(pgid: int, workers: list[int], sig: int) -> None:
    """torchrun puts each worker in a session of its own: signal them as well as torchrun."""
    _signal_group(pgid, sig)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _forward_signals(pgid: int, workers: Callable[[], list[int]], out: TextIO) -> None:
    """Ctrl-C and SIGTERM reach the job (it runs in its own session) instead of killing us. A
    second one kills the job outright: whoever presses Ctrl-C again wants it gone now, not after
    torchrun's own grace period."""
    loop = asyncio.get_running_loop()
    received = 0

    def forward(sig: int) -> None:
        nonlocal received
        received += 1
        if received == 1:
            _signal_group(pgid, sig)
        else:
            out.write("watchdog: second signal: killing the job\n")
            _signal_job(pgid, workers(), signal.SIGKILL)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, forward, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
