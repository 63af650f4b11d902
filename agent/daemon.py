"""The agent's main loop (asyncio, one per node): scan beacons, stream reports, serve stacks.

The scan runs whether or not a coordinator is reachable, so exits are timed where they happen;
the stream reconnects with backoff and resends full state each interval (a large job's report
that says only that its ranks progressed is held back once: `holdback`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import replace
from typing import Any

import grpc

from agent.budget import StackBudget
from agent.exits import ExitObserver
from agent.gpu import GpuSampler
from agent.holdback import Holdback
from agent.rankstate import rank_state
from agent.reply_fit import fit_reply
from agent.stacks import dump_stacks
from agent.table import WorkerTable
from agent.userfiles import worker_logs
from agent.worker import Worker
from watchdog import beacondir, metrics
from watchdog.env import DEFAULT_ADDRESS, DEFAULT_PORT
from watchdog.errors import BeaconError, WatchdogError
from watchdog.model import NodeReport, RankStack, StackReply, StackRequest
from watchdog.text import printable
from watchdog.transport import AgentMessage, ClientSecurity, CoordinatorClient

log = logging.getLogger(__name__)

OUTBOX_SIZE = 64
MAX_BACKOFF_S = 10.0
# The stream is down when it took no report for this many intervals (and at least this long).
STREAM_STALE_INTERVALS = 3
STREAM_STALE_MIN_S = 5.0
SLOW_SCAN_S = 5.0  # a scan this long is said: its report is as late


def _make_base(beacon_dir: str) -> None:
    """A root agent makes the beacon base (root's, 1777) before any user's hook needs it: a
    base the first user made would be theirs to move aside (issue 37, finding 6)."""
    if os.geteuid() != 0:
        return
    try:
        os.close(beacondir.open_base(beacon_dir))
    except BeaconError as e:
        log.warning("%s (hint: %s)", printable(str(e)), e.hint)


class Agent:
    def __init__(self, coordinator: str | None, beacon_dir: str, node: str,
                 interval: float = 1.0, scan_unhooked: bool = True,
                 security: ClientSecurity | None = None, native: bool = False) -> None:
        self.configured_coordinator = coordinator
        self.coordinator = coordinator or DEFAULT_ADDRESS
        self.security = security
        self.node = node
        self.interval = interval
        self.native = native  # ask py-spy for native frames too
        _make_base(beacon_dir)
        self.table = WorkerTable(beacon_dir, scan_unhooked=scan_unhooked)
        self.gpu = GpuSampler()
        self._outbox: asyncio.Queue[AgentMessage] = asyncio.Queue(OUTBOX_SIZE)
        self.heartbeat = time.monotonic()  # the last scan: the daemon's health
        self._written: float | None = None  # when the stream last took a message; None: down
        self._stack_budget = StackBudget()
        self._holdback = Holdback()
        self._warned_pinned = False

    def scan(self) -> NodeReport:
        """Refresh the worker table and return the node report for it (blocking: file and /proc
        reads; the loop runs it in a thread)."""
        now = time.time()
        self.table.refresh(now, self.gpu.utilization())
        ranks = tuple(rank_state(w, now) for w in self.table.workers())
        metrics.AGENT_RANKS.set(len(ranks))
        return NodeReport(self.node, now, ranks)

    def stream_up(self) -> bool:
        """Whether the stream to the coordinator took a report within the last few intervals."""
        return (self._written is not None
                and time.monotonic() - self._written < max(STREAM_STALE_INTERVALS * self.interval,
                                                           STREAM_STALE_MIN_S))

    async def run(self, stop: asyncio.Event) -> None:
        """Scan and report until `stop` is set; no error ends this loop."""
        self.table.exits = ExitObserver.open()  # how workers end, from the kernel where allowed
        scanner = asyncio.create_task(self._scan_loop(stop))
        backoff = 0.5
        try:
            while not stop.is_set():
                try:
                    if await _until(stop, self._session(stop)):
                        backoff = 0.5
                except (grpc.aio.AioRpcError, WatchdogError, OSError) as e:
                    log.warning("coordinator %s: %s; retrying in %.1fs", self.coordinator,
                                _describe(e), backoff)
                if not stop.is_set():
                    metrics.RECONNECTS.inc()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            scanner.cancel()  # its pass in a thread may still be under way: close after it
            await asyncio.to_thread(self.table.close_exits)

    async def _scan_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.heartbeat = time.monotonic()
            try:
                started = time.monotonic()
                report = await asyncio.to_thread(self.scan)
                if self._holdback.worth_sending(report, self.stream_up() and self._outbox.empty()):
                    self._offer(report)
                took = time.monotonic() - started
                if took > SLOW_SCAN_S:  # the coordinator may take this node for lost
                    log.warning("a scan took %.1f s: this node's report was that late", took)
            except Exception:  # a loop that must not die: log and go on
                log.exception("scan failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    def _offer(self, message: AgentMessage) -> None:
        """Queue without blocking; a full queue sheds its oldest entry (reports are full state)."""
        if self._outbox.full():
            self._outbox.get_nowait()
        self._outbox.put_nowait(message)

    def _choose_coordinator(self) -> None:
        """Without --coordinator: the default port on the MASTER_ADDR of a job seen here, for
        an agent of one user without a token in clear. Any user's job names its MASTER_ADDR: a
        root agent following it would hand every user's reports to that address and take its
        stack requests (each pauses training), and a token would go to it in clear."""
        if self.configured_coordinator:
            return
        token_in_clear = self.security is not None and bool(self.security.token) and (
            self.security.credentials is None)
        if os.geteuid() == 0 or token_in_clear:
            if not self._warned_pinned:
                self._warned_pinned = True
                log.warning("%s never follows a job's MASTER_ADDR: using %s (pass --coordinator "
                            "for another)", "a root agent" if os.geteuid() == 0 else
                            "an agent with a token and no TLS", self.coordinator)
            return
        masters = sorted({w.master_addr for w in self.table.workers() if w.master_addr})
        chosen = f"{masters[0]}:{DEFAULT_PORT}" if masters else DEFAULT_ADDRESS
        if chosen != self.coordinator:
            log.info("coordinator: %s (the MASTER_ADDR of the jobs on this node)",
                     printable(chosen))
            self.coordinator = chosen

    async def _session(self, stop: asyncio.Event) -> None:
        self._choose_coordinator()
        client = CoordinatorClient(self.coordinator, self.security)
        served: set[asyncio.Task[None]] = set()
        try:
            async for request in client.connect(self._outgoing(stop)):
                task = asyncio.create_task(self._serve(request))
                served.add(task)
                task.add_done_callback(served.discard)
        finally:
            self._written = None
            for task in served:
                task.cancel()
            await client.close()

    async def _outgoing(self, stop: asyncio.Event) -> AsyncIterator[AgentMessage]:
        while not stop.is_set():
            yield await self._outbox.get()
            self._written = time.monotonic()  # the stream wants the next one: this one went

    async def _serve(self, request: StackRequest) -> None:
        try:
            now = time.monotonic()  # one clock for the job's budget and its processes'
            refusal = self._stack_budget.refuse(request.job_id, now)
            stacks = (await self.collect_stacks(request.job_id, request.ranks, request.samples,
                                                now)
                      if not refusal
                      else [RankStack(rank, 0, error=refusal) for rank in request.ranks])
            reply = StackReply(request.request_id, self.node, tuple(stacks))
            self._offer(await asyncio.to_thread(fit_reply, reply))
        except Exception:
            log.exception("stack request %d failed", request.request_id)

    async def collect_stacks(self, job_id: str, ranks: tuple[int, ...], samples: int,
                             now: float) -> list[RankStack]:
        """Stacks of the local ranks asked for, at monotonic `now`; only live workers of the
        table (verified) are attached to, each process at most once a MIN_INTERVAL_S."""
        targets: list[Worker] = []
        refused: list[RankStack] = []
        for rank in ranks:
            worker = self.table.find(job_id, rank)
            if worker is None:
                continue
            pid = worker.identity.pid
            why = ("not attaching: it has exited" if not worker.alive
                   else self._stack_budget.refuse_process(pid, now))
            if why:
                refused.append(RankStack(rank, pid, error=why))
            else:
                targets.append(worker)
        started = time.monotonic()
        stacks = await dump_stacks(
            [(w.identity.rank, w.identity.pid, w.start_ticks, w.owner.uid if w.owner else None)
             for w in targets], self.native, samples)
        if targets:
            metrics.STACK_SECONDS.observe(time.monotonic() - started)
            metrics.STACK_FAILURES.inc(sum(1 for stack in stacks if stack.error))
        logs = await asyncio.gather(*(worker_logs(worker) for worker in targets))
        with_logs = [replace(stack, nccl_log=nccl, worker_log=output)
                     for stack, (nccl, output) in zip(stacks, logs, strict=True)]
        return [*with_logs, *refused]


async def _until(stop: asyncio.Event, work: Coroutine[Any, Any, None]) -> bool:
    """Run `work` until it ends (True) or `stop` is set (False: `work` is cancelled)."""
    task = asyncio.create_task(work)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    task.result()  # re-raise what ended the session
    return True


def _describe(e: BaseException) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return e.details() or e.code().name
    return str(e)
