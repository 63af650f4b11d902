"""A STRAGGLER notice: who holds the job back, by how much, and where (coordinator process).

Where is read from a few stack samples of every rank: in those where most of the others wait
in a collective, the place the straggler is at most often (its innermost frame of the user's
own code, or that of the DataLoader worker or child it waits on).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence

from watchdog import metrics
from watchdog.coordinator.evidence import child_name, collective_frame
from watchdog.coordinator.incident import build_finding_incident
from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.silent_bugs import Finding
from watchdog.coordinator.stack_requests import StackRequests
from watchdog.coordinator.straggler import Slowest
from watchdog.frames import frame_site, is_library_frame, stuck_frame
from watchdog.model import Frame, Kind, RankStack, RankState
from watchdog.schema import Incident, SlowestRank
from watchdog.text import ranks_text

STACK_SAMPLES = 3  # stack samples of every rank taken to say where a straggler is

log = logging.getLogger(__name__)
Tell = Callable[[Incident], Awaitable[None]]


class StragglerNotices:
    """Calls each job's stragglers once they persist, and ends the notice when they catch up:
    `announce` stores and tells a new one, `store` stores one again with `ended_at`."""

    def __init__(self, stacks: StackRequests, announce: Tell, store: Tell) -> None:
        self.stacks, self.announce, self.store = stacks, announce, store
        self._gauged: set[str] = set()  # the jobs with a lost-time gauge

    def judge(self, job: JobView, now: float) -> asyncio.Task[None] | None:
        """Measure the job's slowest rank, and start telling what changed; a fault is logged."""
        try:
            tracker = job.stragglers
            job.slowest = tracker.slowest(job.world_size)
            self._gauge(job.job_id, job.slowest)
            called = tracker.evaluate(job.slowest, now)
        except Exception:
            log.exception("measuring the stragglers of job %s failed", job.job_id)
            return None
        if called is None:
            return None
        if called and job.slowest is not None:
            return asyncio.create_task(self._tell(job, job.slowest, called))
        return asyncio.create_task(self._end(job, now))

    def forget(self, job_id: str) -> None:
        self._gauge(job_id, None)

    def _gauge(self, job_id: str, slowest: Slowest | None) -> None:
        if slowest is not None:
            metrics.STRAGGLER_LOST.labels(job_id).set(slowest.lost)
            self._gauged.add(job_id)
        elif job_id in self._gauged:
            self._gauged.discard(job_id)
            metrics.STRAGGLER_LOST.remove(job_id)

    async def _tell(self, job: JobView, slowest: Slowest, called: tuple[int, ...]) -> None:
        try:
            samples = [await self.stacks.gather(job, tuple(job.ranks), 1)
                       for _ in range(STACK_SAMPLES)]
            now = time.time()
            snapshot = job.snapshot(now)
            others = [r for r in sorted(job.ranks) if r not in called]
            text = summary(job.ranks, slowest, called, where(samples, called[0], others))
            step = min(job.ranks[r].steps for r in called if r in job.ranks)
            finding = Finding(Kind.STRAGGLER, f"{ranks_text(called)} from step {step}",
                              called, step, text)
            incident = build_finding_incident(snapshot, finding, uuid.uuid4().hex[:12], now)
            incident["waiting_ranks"] = others
            job.findings.incidents.append(incident)
            await self.announce(incident)
        except Exception:
            log.exception("telling the stragglers of job %s failed", job.job_id)

    async def _end(self, job: JobView, now: float) -> None:
        try:
            for incident in job.findings.incidents:
                if is_straggler(incident) and "ended_at" not in incident:
                    incident["ended_at"] = now
                    await self.store(incident)
                    log.info("incident %s ended: the stragglers caught up", incident["id"])
        except Exception:
            log.exception("ending the straggler notice of job %s failed", job.job_id)


def _place(stack: RankStack) -> str:
    for child in stack.children:
        frame = stuck_frame(child.frames)
        if frame is not None and not is_library_frame(frame):
            return f"{child_name(child)}, in {_at(frame)}"
    frame = stuck_frame(stack.frames)
    return f"in {_at(frame)}" if frame is not None else ""


def _at(frame: Frame) -> str:
    return f"{frame.function} at {frame_site(frame)}"


def _waits(stack: RankStack | None) -> str:
    frame = collective_frame(stack.frames) if stack is not None else None
    if frame is None:
        return ""
    return "DDP's all-reduce (in backward)" if "backward" in frame.function else frame.function


def where(samples: Sequence[dict[int, RankStack]], rank: int,
          others: Sequence[int]) -> tuple[str, str]:
    """Where `rank` most often is while most of `others` wait, and where they wait; ("", "")
    when no sample caught them waiting."""
    places: Counter[str] = Counter()
    waits: Counter[str] = Counter()
    for stacks in samples:
        waiting = [w for r in others if (w := _waits(stacks.get(r)))]
        own = stacks.get(rank)
        if own is None or 2 * len(waiting) <= len(others):
            continue
        waits.update(waiting)
        if place := _place(own):
            places[place] += 1
    return (places.most_common(1)[0][0] if places else "",
            waits.most_common(1)[0][0] if waits else "")


def summary(ranks: Mapping[int, RankState], slowest: Slowest, stragglers: Sequence[int],
            place: tuple[str, str]) -> str:
    """'rank 3 (host node-b) holds the job back 0.41 s per step (82% of each step), in
    read_shard at data.py:16; ranks 0-2 wait in all_reduce'."""
    hosts = sorted({ranks[r].host for r in stragglers if r in ranks})
    others = [r for r in sorted(ranks) if r not in stragglers]
    many = len(stragglers) > 1
    text = (f"{ranks_text(stragglers)} ({'hosts' if len(hosts) > 1 else 'host'} "
            f"{', '.join(hosts)}) {'hold' if many else 'holds'} the job back "
            f"{slowest.lost:.2f} s per step ({slowest.share:.0%} of each step)")
    held, waited = place
    if held:
        text += f", {held}"
    if waited and others:
        text += f"; {ranks_text(others)} {'wait' if len(others) > 1 else 'waits'} in {waited}"
    return text


def slowest_json(ranks: Mapping[int, RankState], slowest: Slowest | None,
                 called: Sequence[int]) -> SlowestRank | None:
    """`watchdog status`'s slowest rank of a job, even below the straggler's threshold."""
    if slowest is None:
        return None
    state = ranks.get(slowest.rank)
    return {"rank": slowest.rank, "host": state.host if state is not None else "",
            "lost_per_step": round(slowest.lost, 3), "share": round(slowest.share, 3),
            "straggler": slowest.rank in called}


def is_straggler(incident: Incident) -> bool:
    return incident["kind"] == Kind.STRAGGLER
