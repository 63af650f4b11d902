"""The coordinator (asyncio; its own process, or embedded in `watchdog run`).

Joins node reports into jobs (`jobs.JobView`), and each tick carries out what each job's
`Judgement` decides: asks the agents for stacks (`stack_requests`), waits a moment for the exits
of the peers of a rank that raised (`settle`), persists the incident, then tells its listeners.
An incident is stored before anyone hears of it, so a crash after that loses nothing; when the
database fails, it is told all the same and stored once the database works again (`persist`).
A notice whose rank moved on, or a hang the job contradicted, is stored again with `ended_at` or
`resumed_at`, and told to `ended_listeners`. An exit is the launcher's to handle; once per exit
incident, a job still hung a threshold after the exit (`after_exit`) is logged and told to
`still_hung_listeners` (`watchdog run` acts on it as on a hang). Which agent may report which
node and answer which request: `sessions`; which ranks a job trusts: `admission`. A job no
report mentioned for `job_retention` seconds is forgotten: memory stays bounded however long
the coordinator runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection

from watchdog import metrics
from watchdog.coordinator.actions import (
    Action,
    EndNotice,
    Look,
    MarkResumed,
    Nothing,
    SawProgress,
    Tell,
    TellStillHung,
    Wait,
)
from watchdog.coordinator.admission import Admission
from watchdog.coordinator.after_exit import StillHung
from watchdog.coordinator.fit import MAX_STATUS_BYTES, fit
from watchdog.coordinator.garbage_collection import sparing_full_collections
from watchdog.coordinator.incident import build_finding_incident, build_incident, rank_table
from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.judgement import Judgement, Stage
from watchdog.coordinator.node_silence import NodeSilence
from watchdog.coordinator.persist import IncidentSaver
from watchdog.coordinator.sessions import Sessions
from watchdog.coordinator.settle import settle_exits
from watchdog.coordinator.stack_requests import StackRequests
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.store import IncidentStore
from watchdog.coordinator.straggler_notice import StragglerNotices, slowest_json
from watchdog.model import FINDINGS, JobSnapshot, Kind, NodeReport, StatusQuery, Verdict
from watchdog.schema import Incident, StatusJob
from watchdog.text import printable
from watchdog.transport.rpc import AgentMessage, AgentSession

log = logging.getLogger(__name__)

# How long an incident waits for the database, past its busy timeout, before it is told
# anyway: a locked database has refused it by then and it is kept aside, so what is told
# survives a SIGKILL; a filesystem that hangs delays the telling no longer than this.
SAVE_WAIT_S = 1.0
JOB_RETENTION_S = 600.0
MAX_JOBS = 16384  # beyond it, the jobs of whoever follows the most are forgotten first (_make_room)
ROOM_MADE = MAX_JOBS // 16  # jobs forgotten at once, so that making room is rare work
SWEEP_S = 5.0

IncidentListener = Callable[[Incident], None]
# A notice that ended (with `ended_at`) or a hang the job contradicted (with `resumed_at`), and
# how long its stall lasted, in seconds.
EndedListener = Callable[[Incident, float], None]
StillHungListener = Callable[[StillHung], None]
# hangs and RANK_BUSY: what a job's judgement tells (a STRAGGLER is told beside it)
JUDGED_KINDS = tuple(k.value for k in Kind if k not in FINDINGS and k is not Kind.STRAGGLER)
# A tick carries out at most this many actions a job: each moves its judgement on (an incident
# closed, an exit followed, a look begun), so it takes three at most; a refused move must not
# spin the loop.
MAX_ACTIONS = len(Stage)


class Coordinator:
    def __init__(self, store: IncidentStore, policy: StallPolicy, tick: float = 0.25,
                 job_retention: float = JOB_RETENTION_S) -> None:
        self.store = store
        self.saver = IncidentSaver(store)
        self.policy = policy
        self.tick = tick
        self.job_retention = job_retention
        self.jobs: dict[str, JobView] = {}
        self.judgements: dict[str, Judgement] = {}
        self.listeners: list[IncidentListener] = []
        self.ended_listeners: list[EndedListener] = []
        self.still_hung_listeners: list[StillHungListener] = []
        self.sessions = Sessions()
        self.admission = Admission(policy)
        self.nodes = NodeSilence(tick)
        self._job_seen: dict[str, float] = {}
        self.stacks = StackRequests(self.sessions)
        self.stragglers = StragglerNotices(self.stacks, self._announce, self._store)
        self._swept_at = 0.0
        self._in_flight: set[asyncio.Task[None]] = set()  # diagnoses and findings being told
        self.heartbeat = time.monotonic()  # the last turn of `run`: the daemon's health

    # -- CoordinatorHandler: called by the gRPC servicer --
    def open_session(self, peer: str, names: frozenset[str] | None = None) -> AgentSession:
        session = AgentSession(peer, names)
        self.sessions.open(session)
        metrics.AGENTS.set(len(self.sessions.connected))
        log.info("agent connected from %s", peer)
        return session

    def close_session(self, session: AgentSession) -> None:
        self.sessions.close(session)
        metrics.AGENTS.set(len(self.sessions.connected))
        log.info("agent %s (%s) disconnected", printable(session.node or "?"), session.peer)

    def on_message(self, session: AgentSession, message: AgentMessage) -> None:
        if isinstance(message, NodeReport):
            now = time.time()
            if self.sessions.bind(session, message.node,
                                  self.nodes.silence(message.node, now)[0]):
                self.ingest(message, now)
        else:
            self.sessions.answer(session, message)

    def let_go(self, job_id: str) -> None:
        """The job is being ended on a hang's verdict: its ranks' exits, killed by that end,
        are no new incident (`Judgement.let_go`)."""
        judgement = self.judgements.get(job_id)
        if judgement is not None:
            judgement.let_go()

    def status_json(self, query: StatusQuery) -> str:
        now = time.time()
        jobs = [self.job_status(job, now, query.ranks) for job in self.jobs.values()
                if not query.job_id or job.job_id == query.job_id]
        share = MAX_STATUS_BYTES // max(1, len(jobs))
        return json.dumps({"jobs": [fit(job, share) for job in jobs]})

    # -- state --
    def ingest(self, report: NodeReport, now: float) -> None:
        """Take one node report, received at `now`."""
        self.nodes.heard(report.node, now)
        metrics.REPORTS.inc()
        flagged: set[str] = set()
        job: JobView | None = None
        for state in report.ranks:
            if job is None or job.job_id != state.job_id:  # a node's ranks are mostly one job's
                job = self.jobs.get(state.job_id) or self._new_job(state.job_id, state.world_size)
                self._job_seen[job.job_id] = now
            if self.admission.admit(job, report.node, state, now):
                job.update(report.node, state, now)
            else:
                flagged.add(job.job_id)
        for job_id in flagged:
            job = self.jobs[job_id]
            self.jobs[job_id] = self.admission.reconsider(job, now)
            if self.jobs[job_id] is not job:  # a view of the job anew: its judgement too
                self.judgements[job_id] = Judgement(job_id, self.nodes)

    def _new_job(self, job_id: str, world_size: int) -> JobView:
        if len(self.jobs) >= MAX_JOBS:
            self._make_room()
        job = self.jobs[job_id] = JobView(job_id, self.policy)
        self.judgements[job_id] = Judgement(job_id, self.nodes)
        log.info("new job %s (world size %d)", printable(job_id), world_size)
        return job

    def _make_room(self) -> None:
        """Forget ROOM_MADE jobs, each the one reported least recently of the user who then
        has the most jobs: one user's job ids (many processes, or one holding many beacons)
        push out their own jobs, never another user's while they hold more."""
        by_owner: dict[str, deque[str]] = {}
        for job_id in sorted(self.jobs, key=lambda j: self._job_seen.get(j, 0.0)):
            by_owner.setdefault(self.owner_of(job_id), deque()).append(job_id)
        largest = [(-len(jobs), owner) for owner, jobs in by_owner.items()]
        heapq.heapify(largest)
        forgotten = min(ROOM_MADE, len(self.jobs))
        for _ in range(forgotten):
            _, owner = heapq.heappop(largest)
            self._forget_job(by_owner[owner].popleft())
            if by_owner[owner]:
                heapq.heappush(largest, (-len(by_owner[owner]), owner))
        log.warning("following %d jobs already; forgot %d, each the one reported least recently "
                    "of the user with the most jobs", MAX_JOBS, forgotten)

    def owner_of(self, job_id: str) -> str:
        """The user the job's ranks run as (`JobView.owner`; "" for a job not followed)."""
        job = self.jobs.get(job_id)
        return job.owner if job is not None else ""

    def _forget_job(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self.judgements.pop(job_id, None)
        self._job_seen.pop(job_id, None)
        self.stacks.forget(job_id)
        self.stragglers.forget(job_id)
        self.admission.forget(job_id)

    def forget_old(self, now: float) -> None:
        """Forget the jobs, and the nodes, no report mentioned for `job_retention` seconds: a
        job that ended is reported by its agents a while after its exit, then not at all."""
        for job_id in [j for j, seen in self._job_seen.items() if now - seen > self.job_retention]:
            if self.judgements[job_id].stage is not Stage.LOOKING:
                self._forget_job(job_id)
        for node in self.nodes.quiet_for(self.job_retention, now):
            if self.sessions.session_of(node) is None:
                self.nodes.forget(node)

    def job_status(self, job: JobView, now: float, wanted: Collection[int] = ()) -> StatusJob:
        """A job as `watchdog status --json` gives it; a large one's ranks grouped, but for its
        culprits and the ranks `wanted`."""
        judgement = self.judgements[job.job_id]
        verdict = judgement.verdict(job)
        snapshot = job.snapshot(now)
        return {"job_id": job.job_id, "attempt": snapshot.attempt,
                "state": judgement.job_state(job, now),
                "world_size": job.world_size, "nodes": sorted(set(job.nodes.values())),
                **rank_table(snapshot, verdict["culprit_ranks"] if verdict else (), wanted),
                "verdict": verdict,
                "findings": list(job.findings.incidents),
                "flagged": self.admission.to_json(job.job_id),
                "slowest": slowest_json(job.ranks, job.slowest, job.stragglers.called)}

    # -- decisions --
    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate every job each tick until `stop`; no error ends this loop."""
        retries = asyncio.create_task(self.saver.retry_until(stop))
        with sparing_full_collections():
            await self._loop(stop)
        await retries

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.heartbeat = time.monotonic()
            now = time.time()
            paused = self.nodes.turn(now)
            if paused:
                log.warning("the coordinator did not run for %.1f s (the machine paused, the "
                            "clock stepped or the loop starved): no node is blamed for it", paused)
            try:
                self.evaluate_all(now)
                if now - self._swept_at >= SWEEP_S:
                    self._swept_at = now
                    self.forget_old(now)
            except Exception:
                log.exception("evaluation failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick)

    def evaluate_all(self, now: float) -> list[asyncio.Task[None]]:
        """Judge every job as of `now`; a diagnosis that needs stacks runs as a task."""
        tasks = self._judge_all(now)
        self._in_flight.update(tasks)
        for task in tasks:
            task.add_done_callback(self._in_flight.discard)
        return tasks

    async def settled(self) -> None:
        """Wait for the diagnoses begun so far: the job ended, and what they find is still
        said (an exit waiting for its peers' exits, `settle`, above all)."""
        await asyncio.gather(*self._in_flight, return_exceptions=True)

    def _judge_all(self, now: float) -> list[asyncio.Task[None]]:
        tasks = []
        for job_id, job in self.jobs.items():
            judgement = self.judgements[job_id]
            judgement.observed(job.observe(now))
            if job.findings.pending:
                tasks += self._report_findings(job, now)
            if (told := self.stragglers.judge(job, now)) is not None:
                tasks.append(told)
            for _ in range(MAX_ACTIONS):
                action = judgement.step(job, now)
                if isinstance(action, Wait | Nothing) or not judgement.apply(action):
                    break
                task = self._carry_out(job, judgement, action)
                if task is not None:
                    tasks.append(task)
        return tasks

    def _carry_out(self, job: JobView, judgement: Judgement,
                   action: Action) -> asyncio.Task[None] | None:
        """Do what the job's judgement decided this tick: a look runs as a task, and so does the
        storing and telling of an incident's end."""
        _say(job, action)
        if isinstance(action, Look):
            if action.first:
                metrics.STALLS.inc()
            return asyncio.create_task(self._look(job, judgement, action))
        if isinstance(action, MarkResumed):
            metrics.VERDICTS_RESUMED.inc()
        if isinstance(action, EndNotice | MarkResumed):
            return asyncio.create_task(self._moved_on(action.incident, action.lasted))
        if isinstance(action, TellStillHung):
            for listener in self.still_hung_listeners:
                listener(action.still)
        return None

    async def _look(self, job: JobView, judgement: Judgement, look: Look) -> None:
        """Take the job's stacks and carry out what the judgement concludes of them."""
        started = time.monotonic()
        try:
            await settle_exits(job, self.tick)
            live = tuple(r.rank for r in job.ranks.values() if r.alive)
            # Several stacks a rank, to see whether Python moves; one where a rank just exited.
            stacks = await self.stacks.gather(job, live, look.samples)
            now = time.time()
            action = judgement.conclude(job, look, stacks, now)
            judgement.apply(action)
            _say(job, action)
            if isinstance(action, SawProgress):
                job.moved_stacks(action.stacks)
            elif isinstance(action, Tell):
                await self._report(job, judgement, action.snapshot, action.verdict, now)
                metrics.VERDICT_SECONDS.observe(time.monotonic() - started)
        except Exception:
            log.exception("diagnosing job %s failed", job.job_id)
        finally:
            judgement.looked()

    def _report_findings(self, job: JobView, now: float) -> list[asyncio.Task[None]]:
        """Each new finding of the job, stored and told in a task of its own; a fault here is
        logged and never keeps the job from being judged for hangs."""
        tasks = []
        try:
            snapshot = job.snapshot(now)
            for finding in job.findings.evaluate(snapshot, now):
                incident = build_finding_incident(snapshot, finding, uuid.uuid4().hex[:12], now)
                job.findings.incidents.append(incident)
                tasks.append(asyncio.create_task(self._announce_finding(job, incident)))
        except Exception:
            log.exception("checking job %s for findings failed", job.job_id)
        return tasks

    async def _announce_finding(self, job: JobView, incident: Incident) -> None:
        """Tell a finding, unless it was stored before a restart: then show the stored one."""
        try:
            for text in await self.saver.kind_json(incident["job_id"], incident["kind"]):
                stored: Incident = json.loads(text)
                if stored.get("finding", {}).get("key") == incident["finding"]["key"]:
                    found = job.findings.incidents
                    found[found.index(incident)] = stored
                    return
            await self._announce(incident)
        except Exception:
            log.exception("reporting a finding of job %s failed", job.job_id)

    async def _store(self, incident: Incident) -> None:
        """Store the incident before anyone hears of it, unless the database keeps it waiting:
        then it is told now, kept aside if the database refused it, and stored when it can be
        (the save goes on; a failure is retried)."""
        owner = self.owner_of(incident["job_id"])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.saver.save(incident, owner)),
                                   self.store.busy_timeout + SAVE_WAIT_S)

    async def _announce(self, incident: Incident) -> None:
        """Store the incident, then tell the listeners."""
        await self._store(incident)
        metrics.INCIDENTS.labels(incident["kind"], incident["severity"]).inc()
        log.info("incident %s: %s", incident["id"], printable(incident["summary"]))
        for listener in self.listeners:
            listener(incident)

    async def _moved_on(self, incident: Incident, lasted: float) -> None:
        """Store the incident again, now with `ended_at` (a notice) or `resumed_at` (a hang the
        job contradicted), then tell the listeners of ends how long its stall lasted."""
        try:
            await self._store(incident)
            log.info("incident %s ended: the job moved on after %.0f s", incident["id"], lasted)
            for listener in self.ended_listeners:
                listener(incident, lasted)
        except Exception:
            log.exception("recording the end of incident %s failed", incident["id"])

    async def _report(self, job: JobView, judgement: Judgement, snapshot: JobSnapshot,
                      verdict: Verdict, now: float) -> None:
        """Store the incident, then tell the listeners, once."""
        incident = build_incident(snapshot, verdict, uuid.uuid4().hex[:12], now)
        stored = await self.stored_twin(incident)
        judgement.told(stored or incident, job.events_total(), job.exits)
        if stored is not None:
            log.info("incident %s was stored before a restart; not repeating it", stored["id"])
            return
        await self._announce(incident)

    async def stored_twin(self, incident: Incident) -> Incident | None:
        """The stored incident of the same hang (job, kind, culprits, collective), if any: a
        coordinator restarted mid-hang must not report it twice."""
        latest = await self.saver.latest_json(incident["job_id"], JUDGED_KINDS)
        if latest is None:
            return None
        stored: Incident = json.loads(latest)
        same = (stored["kind"], stored["culprit_ranks"], stored["collective"]) == (
            incident["kind"], incident["culprit_ranks"], incident["collective"])
        return stored if same else None


def _say(job: JobView, action: Action) -> None:
    if action.level is not None:
        log.log(action.level, "job %s: %s", printable(job.job_id), printable(action.reason))
