"""Stacks on demand (coordinator process): asks each node's agent for a job's ranks' stacks
over their sessions, at most once every STACK_INTERVAL_S a job, and waits a bounded time."""

from __future__ import annotations

import asyncio
import time

from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.sessions import Sessions
from watchdog.model import RankStack, StackReply

STACK_WAIT_S = 10.0
STACK_INTERVAL_S = 2.0  # a job's stacks at most this often: each dump pauses its ranks


class StackRequests:
    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self._asked: dict[str, float] = {}  # job id -> monotonic time

    def forget(self, job_id: str) -> None:
        self._asked.pop(job_id, None)

    async def gather(self, job: JobView, ranks: tuple[int, ...],
                     samples: int = 1) -> dict[int, RankStack]:
        """Ask each node's agent for its ranks' stacks (`samples` each, spread over about a
        second); wait a bounded time for each. A job's stacks are asked for at most once every
        STACK_INTERVAL_S (this waits for its turn)."""
        last = self._asked.get(job.job_id)
        if last is not None:
            await asyncio.sleep(max(0.0, last + STACK_INTERVAL_S - time.monotonic()))
        self._asked[job.job_id] = time.monotonic()
        by_node: dict[str, list[int]] = {}
        for rank in ranks:
            by_node.setdefault(job.nodes.get(rank, ""), []).append(rank)
        asked: list[tuple[int, asyncio.Future[StackReply]]] = []
        for node, local in by_node.items():
            session = self.sessions.session_of(node)
            request = None if session is None else self.sessions.ask(
                session, job.job_id, tuple(local), samples)
            if request is not None:
                asked.append(request)
        if asked:
            await asyncio.wait([reply for _, reply in asked], timeout=STACK_WAIT_S)
        stacks: dict[int, RankStack] = {}
        for request_id, reply in asked:
            self.sessions.forget(request_id)
            if reply.done():
                stacks.update((s.rank, s) for s in reply.result().stacks)
        return stacks
