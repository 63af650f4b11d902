"""The coordinator (asyncio; its own process, or embedded in `watchdog run`).

Joins node reports into jobs, watches each job for a stall or an early exit, asks the agents for
stacks, decides the verdict, persists the incident, then tells its listeners. An incident is
stored before anyone hears of it, so a crash after that loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from watchdog import metrics
from watchdog.coordinator.evidence import culprit_place
from watchdog.coordinator.incident import build_finding_incident, build_incident, rank_rows
from watchdog.coordinator.jobs import LEARNED_MARGIN, JobView, is_hang
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.store import IncidentStore
from watchdog.coordinator.verdict import decide
from watchdog.model import (
    FINDINGS,
    JobSnapshot,
    Kind,
    NodeReport,
    RankStack,
    Severity,
    StackReply,
    StackRequest,
    Verdict,
)
from watchdog.transport.rpc import AgentMessage, AgentSession

log = logging.getLogger(__name__)

STACK_WAIT_S = 10.0
STACK_SAMPLES = 3  # stacks of each rank when a job stalled: does its Python move?
RECHECK_S = 10.0  # a stall whose ranks work is looked at again after this long
MAX_JOBS = 4096
NODE_TIMEOUT_S = 15.0  # no report for this long: the node is unreachable
SILENT_INTERVALS = 3  # no report for this many report intervals: judge nothing on stale data

IncidentListener = Callable[[dict[str, Any]], None]
JUDGED_KINDS = tuple(kind.value for kind in Kind if kind not in FINDINGS)  # hangs and notices


class Coordinator:
    def __init__(self, store: IncidentStore, policy: StallPolicy, tick: float = 0.25) -> None:
        self.store = store
        self.policy = policy
        self.tick = tick
        self.jobs: dict[str, JobView] = {}
        self.listeners: list[IncidentListener] = []
        self._sessions: set[AgentSession] = set()
        self._node_seen: dict[str, float] = {}
        self._node_interval: dict[str, float] = {}
        self._pending: dict[int, asyncio.Future[StackReply]] = {}
        self._request_ids = itertools.count(1)
        self.heartbeat = time.monotonic()  # the last turn of `run`: the daemon's health

    # -- CoordinatorHandler: called by the gRPC servicer --
    def open_session(self, peer: str) -> AgentSession:
        session = AgentSession(peer)
        self._sessions.add(session)
        metrics.AGENTS.set(len(self._sessions))
        log.info("agent connected from %s", peer)
        return session

    def close_session(self, session: AgentSession) -> None:
        self._sessions.discard(session)
        metrics.AGENTS.set(len(self._sessions))
        log.info("agent %s (%s) disconnected", session.node or "?", session.peer)

    def on_message(self, session: AgentSession, message: AgentMessage) -> None:
        if isinstance(message, NodeReport):
            session.node = message.node
            self.ingest(message, time.time())
        else:
            future = self._pending.pop(message.request_id, None)
            if future is not None and not future.done():
                future.set_result(message)

    def status_json(self, job_id: str) -> str:
        now = time.time()
        jobs = [self.job_status(job, now) for job in self.jobs.values()
                if not job_id or job.job_id == job_id]
        return json.dumps({"jobs": jobs})

    # -- state --
    def ingest(self, report: NodeReport, now: float) -> None:
        """Take one node report, received at `now`."""
        previous = self._node_seen.get(report.node)
        if previous is not None:  # a smoothed report interval, for how long silence may last
            interval = self._node_interval.get(report.node, now - previous)
            self._node_interval[report.node] = 0.8 * interval + 0.2 * (now - previous)
        self._node_seen[report.node] = now
        metrics.REPORTS.inc()
        for state in report.ranks:
            job = self.jobs.get(state.job_id)
            if job is None:
                if len(self.jobs) >= MAX_JOBS:
                    log.warning("tracking %d jobs already; ignoring job %s", MAX_JOBS, state.job_id)
                    continue
                job = self.jobs[state.job_id] = JobView(state.job_id, self.policy)
                log.info("new job %s (world size %d)", state.job_id, state.world_size)
            job.update(report.node, state, now)

    def job_status(self, job: JobView, now: float) -> dict[str, Any]:
        verdict = job.incident if job.incident_open or job.done else None
        return {"job_id": job.job_id, "state": job.state(now), "world_size": job.world_size,
                "nodes": sorted(set(job.nodes.values())),
                "ranks": rank_rows(job.snapshot(now)), "verdict": verdict,
                "findings": list(job.findings.incidents)}

    # -- decisions --
    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate every job each tick until `stop`; no error ends this loop."""
        while not stop.is_set():
            self.heartbeat = time.monotonic()
            try:
                self.evaluate_all(time.time())
            except Exception:
                log.exception("evaluation failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick)

    def node_silence(self, node: str, now: float) -> tuple[bool, bool]:
        """(silent, unreachable): silent after a few missed reports (an agent restarting),
        unreachable after NODE_TIMEOUT_S."""
        age = now - self._node_seen.get(node, now)
        silent = age > max(SILENT_INTERVALS * self._node_interval.get(node, 1.0), 1.0)
        return silent, age > NODE_TIMEOUT_S

    def _unreachable(self, job: JobView, now: float) -> tuple[str, ...] | None:
        """The job's unreachable nodes, or None while one is silent but not yet unreachable."""
        unreachable = []
        for node in sorted(set(job.nodes.values())):
            silent, lost = self.node_silence(node, now)
            if silent and not lost:
                return None
            if lost:
                unreachable.append(node)
        return tuple(unreachable)

    def evaluate_all(self, now: float) -> list[asyncio.Task[None]]:
        """Judge every job as of `now`; a diagnosis that needs stacks runs as a task."""
        tasks = []
        for job in self.jobs.values():
            job.observe(now)
            if job.findings.pending:
                self._report_findings(job, now)
            if job.evaluating or job.hung or (job.incident is not None and job.done):
                continue
            if now < job.hold_until or not job.needs_judgement(now):
                continue
            unreachable = self._unreachable(job, now)
            if unreachable is None:
                continue  # a node missed a few reports: its ranks' state is not known yet
            # A stall is always looked at with stacks: CPU time alone can be a spinning wait.
            stalled = job.stalled(now)
            if stalled or decide(job.snapshot(now, unreachable_nodes=unreachable)) is not None:
                job.evaluating = True
                if stalled and not job.hold_until:  # the first look at this stall
                    metrics.STALLS.inc()
                tasks.append(asyncio.create_task(self._diagnose(job, unreachable, stalled)))
        return tasks

    async def _diagnose(self, job: JobView, unreachable: tuple[str, ...], stalled: bool) -> None:
        started = time.monotonic()
        try:
            live = tuple(r.rank for r in job.ranks.values() if r.alive)
            # Several stacks a rank, to see whether Python moves; one where a rank just exited.
            stacks = await self.gather_stacks(job, live, STACK_SAMPLES if stalled else 1)
            now = time.time()
            snapshot = job.snapshot(now, stacks, unreachable)
            verdict = decide(snapshot)
            if verdict is None:  # progress resumed, or every rank works: look again later
                job.busy, job.hold_until = snapshot.stalled, now + RECHECK_S
                return
            if job.stacks_only and job.stacks_moved(stacks):
                return  # no hook: a changed stack was the only sign of progress, and here it is
            if not self._hold(job, snapshot, verdict, now):
                self._report(job, snapshot, verdict, now)
                metrics.VERDICT_SECONDS.observe(time.monotonic() - started)
        except Exception:
            log.exception("diagnosing job %s failed", job.job_id)
        finally:
            job.evaluating = False

    @staticmethod
    def _hold(job: JobView, snapshot: JobSnapshot, verdict: Verdict, now: float) -> bool:
        """Whether to say nothing now, and when to look again: a stall where an earlier one
        ended by itself, that has not lasted as long yet; a notice already said."""
        if verdict.kind is Kind.RANK_EXITED:
            return False
        job.place = culprit_place(snapshot, verdict.culprit_ranks)
        expected = job.expected(job.place)
        if snapshot.stalled_for < expected:
            job.hold_until = now + expected - snapshot.stalled_for
            log.info("job %s: a stall at %s ended by itself after %.0f s before; waiting",
                     job.job_id, job.place, expected / LEARNED_MARGIN)
            return True
        if verdict.severity is not Severity.HANG:  # again soon, and when the busy timeout passes
            job.busy = True
            job.hold_until = now + min(RECHECK_S, snapshot.busy_timeout - snapshot.stalled_for)
            announced = job.incident if job.incident_open else None  # a notice is said once
            return announced is not None and (announced["kind"], announced["culprit_ranks"]) == (
                verdict.kind, list(verdict.culprit_ranks))
        return False

    def _report_findings(self, job: JobView, now: float) -> None:
        """Store each new finding of the job, then tell the listeners; a fault here is logged
        and never keeps the job from being judged for hangs."""
        try:
            snapshot = job.snapshot(now)
            for finding in job.findings.evaluate(snapshot, now):
                incident = build_finding_incident(snapshot, finding, uuid.uuid4().hex[:12], now)
                stored = self._stored_finding(incident)
                job.findings.incidents.append(stored or incident)
                if stored is None:
                    self._announce(incident)
        except Exception:
            log.exception("checking job %s for findings failed", job.job_id)

    def _stored_finding(self, incident: dict[str, Any]) -> dict[str, Any] | None:
        """The stored incident of the same finding, reported before a restart, if any."""
        for text in self.store.kind_json(incident["job_id"], incident["kind"]):
            stored: dict[str, Any] = json.loads(text)
            if stored.get("finding", {}).get("key") == incident["finding"]["key"]:
                return stored
        return None

    def _announce(self, incident: dict[str, Any]) -> None:
        """Store the incident, then tell the listeners."""
        self.store.add(incident)
        metrics.INCIDENTS.labels(incident["kind"], incident["severity"]).inc()
        log.info("incident %s: %s", incident["id"], incident["summary"])
        for listener in self.listeners:
            listener(incident)

    def _report(self, job: JobView, snapshot: JobSnapshot, verdict: Verdict, now: float) -> None:
        """Store the incident, then tell the listeners, once."""
        incident = build_incident(snapshot, verdict, uuid.uuid4().hex[:12], now)
        stored = self.stored_twin(incident)
        job.incident, job.incident_events = stored or incident, job.events_total()
        job.hung_before = job.hung_before or is_hang(incident)
        if stored is not None:
            log.info("incident %s was stored before a restart; not repeating it", stored["id"])
            return
        self._announce(incident)

    def stored_twin(self, incident: dict[str, Any]) -> dict[str, Any] | None:
        """The stored incident of the same hang (job, kind, culprits, collective), if any: a
        coordinator restarted mid-hang must not report it twice."""
        key = ("kind", "culprit_ranks", "collective")
        latest = self.store.latest_json(incident["job_id"], JUDGED_KINDS)
        if latest is None:
            return None
        stored: dict[str, Any] = json.loads(latest)
        return stored if all(stored[k] == incident[k] for k in key) else None

    async def gather_stacks(self, job: JobView, ranks: tuple[int, ...],
                            samples: int = 1) -> dict[int, RankStack]:
        """Ask each node's agent for its ranks' stacks (`samples` each, spread over about a
        second); wait a bounded time for each."""
        by_node: dict[str, list[int]] = {}
        for rank in ranks:
            by_node.setdefault(job.nodes.get(rank, ""), []).append(rank)
        futures = []
        for session in list(self._sessions):
            local = tuple(by_node.get(session.node, ()))
            if not local or session.outbox.full():
                continue
            request_id = next(self._request_ids)
            future: asyncio.Future[StackReply] = asyncio.get_running_loop().create_future()
            self._pending[request_id] = future
            session.outbox.put_nowait(StackRequest(request_id, job.job_id, local, samples))
            futures.append((request_id, future))
        if futures:
            await asyncio.wait([f for _, f in futures], timeout=STACK_WAIT_S)
        stacks: dict[int, RankStack] = {}
        for request_id, future in futures:
            self._pending.pop(request_id, None)
            if future.done():
                stacks.update((s.rank, s) for s in future.result().stacks)
        return stacks
