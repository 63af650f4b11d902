"""The two processes of the coordinator scale benchmark (tests/bench/coordinator_scale.py).

`SimJob` is a DDP job as its agents would report it: every rank in the world group "0", whose
all_reduce sequence advances with the steps, until `hung_at`: then one rank (the culprit) stops
short of the next all_reduce and every other rank waits in it.
`run_agents` (load generator process) plays one agent per node of 8 ranks, each on its own
Connect stream, reporting at 1 Hz (a report of progress only held back once, as the real agent
does) and answering stack requests with small synthetic stacks.
`serve_coordinator` (coordinator process) runs the real Coordinator behind the real gRPC server,
counting what it ingests and when it detected and reported a hang.
Both take commands over a multiprocessing pipe: `(tag, name, *args)`, answered `(tag, result)`.
"""

from __future__ import annotations

import asyncio
import cProfile
import itertools
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc

from agent.holdback import Holdback
from tests.helpers.builders import DDP_BACKWARD, SITE, TRAIN
from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.sessions import Sessions
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.coordinator.stack_requests import StackRequests
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.store import IncidentStore, incident_json
from watchdog.model import (
    WORLD_GROUP,
    Frame,
    GroupProgress,
    NodeReport,
    RankStack,
    RankState,
    StackReply,
)
from watchdog.transport import wire as _wire
from watchdog.transport.proto import watchdog_pb2 as pb
from watchdog.transport.proto import watchdog_pb2_grpc as pb_grpc
from watchdog.transport.rpc import CHANNEL_OPTIONS, start_server

RANKS_PER_NODE = 8
REPORT_INTERVAL_S = 1.0
MAX_BACKOFF_S = 4.0
STEPS_PER_S = 2.0  # one DDP all_reduce per step, entered at forward, completed at the step
WAITING_STACK = DDP_BACKWARD
STUCK_STACK = (  # the culprit: a dataset read that never returns
    Frame("read_sample_from_storage", TRAIN, 42),
    Frame("__getitem__", TRAIN, 36),
    Frame("fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 52),
    Frame("__next__", f"{SITE}/torch/utils/data/dataloader.py", 733),
    Frame("main", TRAIN, 104),
    Frame("<module>", TRAIN, 130),
)


@dataclass
class SimJob:
    world_size: int
    compact: bool  # send the world group without its member list (the coordinator infers it)
    started_at: float
    hung_at: float | None = None
    members: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.members = () if self.compact else tuple(range(self.world_size))

    @property
    def job_id(self) -> str:
        return f"bench-{self.world_size}"

    @property
    def nodes(self) -> int:
        return self.world_size // RANKS_PER_NODE

    @property
    def culprit(self) -> int:
        return self.world_size // 2 + 3

    def node_name(self, node: int) -> str:
        return f"node-{node:05d}"

    def completed(self, now: float) -> int:
        """all_reduces every rank completed by `now` (the count freezes when the job hangs)."""
        until = now if self.hung_at is None else min(now, self.hung_at)
        return 1 + int((until - self.started_at) * STEPS_PER_S)

    def rank_state(self, rank: int, now: float, listed: bool = True) -> RankState:
        """Rank `rank` as its agent reports it at `now`; without its group's member list when
        not `listed`."""
        done, hung_at = self.completed(now), self.hung_at
        if rank == self.culprit:
            entered = done  # it never enters the next one; running, it is between collectives
        else:
            entered = done + 1 if hung_at is not None else done + ((rank + done) % 4 != 0)
        entered_at = hung_at if hung_at is not None and entered > done else self._at(entered)
        return RankState(
            job_id=self.job_id, rank=rank, local_rank=rank % RANKS_PER_NODE,
            world_size=self.world_size, host=self.node_name(rank // RANKS_PER_NODE),
            pid=10_000 + rank, hooked=True, proc_state="R" if rank == self.culprit else "S",
            heartbeat_age=0.05 + 0.01 * (rank % 10), steps=done, events=entered + 2 * done,
            last_event_at=entered_at, progress_age=max(0.0, now - entered_at),
            groups=(GroupProgress(WORLD_GROUP, self.members if listed else (), entered,
                                  "all_reduce", done, entered_at),))

    def report(self, node: int, now: float, listed: bool = True) -> NodeReport:
        first = node * RANKS_PER_NODE
        ranks = range(first, first + RANKS_PER_NODE)
        return NodeReport(self.node_name(node), now,
                          tuple(self.rank_state(r, now, listed) for r in ranks))

    def stack(self, rank: int) -> RankStack:
        frames = STUCK_STACK if rank == self.culprit else WAITING_STACK
        return RankStack(rank, 10_000 + rank, frames)

    def job_view(self, now: float, policy: StallPolicy) -> JobView:
        """The coordinator's view of every rank as of `now`, as if each node had reported."""
        job = JobView(self.job_id, policy)
        for node in range(self.nodes):
            for state in self.report(node, now).ranks:
                job.update(self.node_name(node), state)
        return job

    def _at(self, seq: int) -> float:
        return self.started_at + (seq - 1) / STEPS_PER_S


def _refresh(message: pb.NodeReport, report: NodeReport) -> None:
    """Copy the fields that change between reports into a message built once per node, so that
    the generator does not rebuild (and copy) a world-sized member list every second."""
    message.sent_at = report.sent_at
    for out, state in zip(message.ranks, report.ranks, strict=True):
        out.steps, out.events, out.last_event_at = state.steps, state.events, state.last_event_at
        out.proc_state, out.heartbeat_age = state.proc_state, state.heartbeat_age or 0.0
        out.progress_age = state.progress_age or 0.0
        group, progress = out.groups[0], state.groups[0]
        group.entered_seq, group.completed_seq = progress.entered_seq, progress.completed_seq
        group.entered_at = progress.entered_at


@dataclass
class _Counters:
    reports: int = 0
    stack_requests: int = 0
    stream_errors: list[str] = field(default_factory=list)


class _SimAgent:
    """One node's agent: a full-state report each second, but one that says only that its ranks
    progressed held back once, as the real agent does (`agent.holdback`); stacks on request."""

    def __init__(self, sim: SimJob, node: int, counters: _Counters,
                 members: pb.GroupProgress) -> None:
        self.sim, self.node, self.counters = sim, node, counters
        # Member lists merged in C: _wire would convert 16k Python ints per rank per node.
        self.message = _wire.report_to_pb(sim.report(node, time.time(), listed=False))
        for rank in self.message.report.ranks:
            rank.groups[0].MergeFrom(members)
        self.outbox: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()  # None: a report
        self.report_queued = False
        self.holdback = Holdback()

    async def run(self, stub: pb_grpc.CoordinatorAsyncStub) -> None:
        """Stream until cancelled; a failed stream is recorded and reopened after a backoff, as
        the real agent does."""
        ticker = asyncio.create_task(self._tick())
        backoff = 0.5
        try:
            while True:
                try:
                    await self._stream(stub)
                except grpc.aio.AioRpcError as e:
                    self.counters.stream_errors.append(f"{e.code().name}: {e.details()}")
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, MAX_BACKOFF_S)
        finally:
            ticker.cancel()

    async def _stream(self, stub: pb_grpc.CoordinatorAsyncStub) -> None:
        async for message in stub.Connect(self._outgoing()):
            request = _wire.coordinator_message_from_pb(message)
            if request is not None:
                self.counters.stack_requests += 1
                stacks = tuple(self.sim.stack(rank) for rank in request.ranks)
                reply = StackReply(request.request_id, self.sim.node_name(self.node), stacks)
                self.outbox.put_nowait(_wire.stacks_to_pb(reply))

    async def _tick(self) -> None:
        """Report every second at this node's own phase; a report not yet sent is not doubled
        (a real agent's outbox sheds stale full-state reports too)."""
        due = self.sim.started_at + REPORT_INTERVAL_S * self.node / self.sim.nodes
        while True:
            await asyncio.sleep(max(0.0, due - time.time()))
            due += REPORT_INTERVAL_S
            if not self.report_queued:
                self.report_queued = True
                self.outbox.put_nowait(None)

    async def _outgoing(self) -> AsyncIterator[pb.AgentMessage]:
        while True:
            item = await self.outbox.get()
            if item is not None:
                yield item
                continue
            self.report_queued = False
            report = self.sim.report(self.node, time.time())
            if not self.holdback.worth_sending(report, delivered=True):
                continue
            _refresh(self.message.report, report)
            self.counters.reports += 1
            yield self.message  # serialized by grpc before this generator is resumed


def _serve_commands(conn: Connection, handle: Callable[..., Any]) -> None:
    """Answer `(tag, name, *args)` commands from the pipe on the running event loop."""

    def on_readable() -> None:
        tag, name, *args = conn.recv()
        conn.send((tag, handle(name, *args)))

    asyncio.get_running_loop().add_reader(conn.fileno(), on_readable)


def run_agents(conn: Connection, address: str, world_size: int, compact: bool,
               nodes_per_channel: int) -> None:
    """Load generator process: world_size / 8 agents until terminated.
    Commands: stats -> dict; hang -> the unix time the job hung."""
    asyncio.run(_agents(conn, address, SimJob(world_size, compact, time.time()),
                        nodes_per_channel))


async def _agents(conn: Connection, address: str, sim: SimJob, nodes_per_channel: int) -> None:
    counters = _Counters()
    n_channels = math.ceil(sim.nodes / nodes_per_channel)
    channels = [grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
                for _ in range(n_channels)]
    stubs = [pb_grpc.CoordinatorStub(channel) for channel in channels]
    members = pb.GroupProgress(ranks=sim.members)
    agents = [_SimAgent(sim, node, counters, members) for node in range(sim.nodes)]

    def handle(name: str) -> Any:
        if name == "hang":
            sim.hung_at = time.time()
            return sim.hung_at
        return {"reports": counters.reports, "stack_requests": counters.stack_requests,
                "stream_errors": counters.stream_errors[:3],
                "failed_streams": len(counters.stream_errors)}

    _serve_commands(conn, handle)
    await asyncio.gather(*(agent.run(stubs[agent.node // nodes_per_channel])
                           for agent in agents))


class _TimedStackRequests(StackRequests):
    """The real stack requests, timed: how long each gathering took, into `gathers`."""

    def __init__(self, sessions: Sessions, gathers: list[float]) -> None:
        super().__init__(sessions)
        self.gathers = gathers

    async def gather(self, job: JobView, ranks: tuple[int, ...],
                     samples: int = 1) -> dict[int, RankStack]:
        start = time.perf_counter()
        stacks = await super().gather(job, ranks, samples)
        self.gathers.append(time.perf_counter() - start)
        return stacks


class CountingCoordinator(Coordinator):
    """The real Coordinator, plus counters: what it ingested, when it started a diagnosis (and
    what that evaluation tick cost), how long the stacks took, when each incident came out."""

    def __init__(self, store: IncidentStore, policy: StallPolicy) -> None:
        super().__init__(store, policy)
        self.reports = 0
        self.rank_states = 0
        self.detections: list[tuple[float, float]] = []  # (unix time, evaluate_all seconds)
        self.gathers: list[float] = []
        self.stacks = _TimedStackRequests(self.sessions, self.gathers)
        self.incidents: list[dict[str, Any]] = []
        self.listeners.append(self._record)

    def ingest(self, report: NodeReport, now: float) -> None:
        self.reports += 1
        self.rank_states += len(report.ranks)
        super().ingest(report, now)

    def evaluate_all(self, now: float) -> list[asyncio.Task[None]]:
        start = time.perf_counter()
        tasks = super().evaluate_all(now)
        if tasks:
            self.detections.append((time.time(), time.perf_counter() - start))
        return tasks

    def _record(self, incident: dict[str, Any]) -> None:
        at = time.time()
        self.incidents.append({
            "at": at, "kind": incident["kind"], "culprits": incident["culprit_ranks"][:8],
            "waiting": len(incident["waiting_ranks"]),
            "stacks": sum(1 for row in incident["ranks"] if row["stack"])
            + sum(group["count"] for group in incident["rank_groups"] if group["stack"]),
            "summary_chars": len(incident["summary"]), "json_bytes": len(incident_json(incident))})

    def stats(self) -> dict[str, Any]:
        return {"reports": self.reports, "rank_states": self.rank_states,
                "ranks_known": sum(len(job.ranks) for job in self.jobs.values()),
                "detections": self.detections, "gathers": self.gathers,
                "incidents": self.incidents}


def serve_coordinator(conn: Connection, db: str, stall_timeout: float) -> None:
    """Coordinator process: sends its port first, then serves until terminated.
    Commands: stats -> dict; profile_on; profile_off PATH (writes cProfile stats there)."""
    asyncio.run(_coordinator(conn, db, stall_timeout))


async def _coordinator(conn: Connection, db: str, stall_timeout: float) -> None:
    coordinator = CountingCoordinator(SqliteStore(db), StallPolicy(fixed=stall_timeout))
    server, port = await start_server(coordinator, "127.0.0.1:0")
    profiler = cProfile.Profile()

    def handle(name: str, *args: str) -> Any:
        if name == "profile_on":
            profiler.enable()
        elif name == "profile_off":
            profiler.disable()
            profiler.dump_stats(args[0])
        return coordinator.stats()

    _serve_commands(conn, handle)
    conn.send(port)
    try:
        await coordinator.run(asyncio.Event())
    finally:
        await server.stop(grace=None)


_tags = itertools.count()


def ask(conn: Connection, timeout: float, name: str, *args: Any) -> Any:
    """Send one command and wait for its answer; None when none came within `timeout` (a late
    answer is recognised by its tag and skipped by the next call)."""
    tag = next(_tags)
    conn.send((tag, name, *args))
    deadline = time.monotonic() + timeout
    while conn.poll(max(0.0, deadline - time.monotonic())):
        got, result = conn.recv()
        if got == tag:
            return result
    return None
