"""A long-running coordinator forgets what it should and stores what it prints (a script, not a
test): `python -m tests.bench.coordinator_soak [--jobs 20000] [--incidents 1000] [--postgres |
--db PATH|URL]` (a SQLite file of its own by default; `--postgres` a throwaway PostgreSQL
server, tests/helpers/postgres.py).

A real `watchdog coordinator` process is fed short jobs over loopback gRPC by one agent (the real
CoordinatorClient, answering stack requests): each job has 2 ranks that run for a moment; in one
job of every jobs/incidents, rank 1 dies (exit code 1) and rank 0 ends a moment later (an
incident), in the others both end cleanly; then the job is no longer reported, as an agent
forgets a job that ended. Jobs overlap (a new one starts every few milliseconds), and the
coordinator runs with a short --job-retention, so it should forget each job seconds after its
last report. Meanwhile readers poll it: `watchdog incidents list` on its database and `watchdog
status`. Printed: the coordinator's RSS and the jobs it follows at the start, the middle and the
end; the database's size; the incidents it printed against those stored (equal); the readers'
rounds and failures; the verdict on the first failing job and on the last (they should read
alike, job ids aside); then the time to store one incident, each of those it stored added again
under a new id through the store the coordinator uses (its retention's pruning included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from watchdog.cli.demo import free_port
from watchdog.coordinator import store_for
from watchdog.coordinator.database import database_of
from watchdog.coordinator.store import IncidentStore, Retention
from watchdog.model import (
    Frame,
    GroupProgress,
    NodeReport,
    RankStack,
    RankState,
    StackReply,
)
from watchdog.transport import AgentMessage, CoordinatorClient

REPORT_INTERVAL_S = 0.1
RUN_S, DYING_S, GONE_S = 0.6, 0.8, 0.4  # a job's phases: running, rank 1 exited, both exited
RETENTION_S = 3.0
MIB = 1 << 20


@dataclass
class Job:
    n: int
    started: float
    fails: bool  # rank 1 dies first: an incident
    verdict: dict[str, Any] | None = None

    @property
    def job_id(self) -> str:
        return f"soak-{self.n:06d}"

    def states(self, now: float) -> list[RankState]:
        age = now - self.started
        if age > RUN_S + DYING_S + GONE_S:
            return []
        steps = int(min(age, RUN_S) / 0.05)
        return [self._rank(rank, steps, now, exited=(
            self._dies(rank) and age > RUN_S) or age > RUN_S + DYING_S) for rank in (0, 1)]

    def _dies(self, rank: int) -> bool:
        return self.fails and rank == 1

    def _rank(self, rank: int, steps: int, now: float, exited: bool) -> RankState:
        end = self.started + RUN_S + (0.0 if self._dies(rank) else DYING_S)
        return RankState(
            job_id=self.job_id, rank=rank, local_rank=rank, world_size=2, host="soak-node",
            pid=100_000 + self.n * 2 + rank, hooked=True, proc_state="" if exited else "S",
            heartbeat_age=0.1, steps=steps, events=3 * steps, last_event_at=now,
            groups=(GroupProgress("0", (), 2 * steps, "all_reduce", 2 * steps,
                                  self.started + steps * 0.05),),
            exited_at=end if exited else None, exit_code=int(self._dies(rank)) if exited
            else None, clean_exit=exited and not self._dies(rank))


@dataclass
class Feeder:
    total: int
    failing_every: int  # one job in so many fails
    started_every: float
    jobs: list[Job] = field(default_factory=list)
    outbox: asyncio.Queue[AgentMessage] = field(default_factory=asyncio.Queue)
    answered: int = 0

    async def outgoing(self) -> AsyncIterator[AgentMessage]:
        while True:
            yield await self.outbox.get()

    async def feed(self) -> None:
        begin = time.time()
        while True:
            now = time.time()
            due = min(self.total, int((now - begin) / self.started_every) + 1)
            self.jobs += [Job(n, now, n % self.failing_every == 0)
                          for n in range(len(self.jobs), due)]
            states = [s for job in self.active(now) for s in job.states(now)]
            self.outbox.put_nowait(NodeReport("soak-node", now, tuple(states)))
            if len(self.jobs) == self.total and not states:
                return
            await asyncio.sleep(REPORT_INTERVAL_S)

    def active(self, now: float) -> list[Job]:
        horizon = RUN_S + DYING_S + GONE_S
        return [job for job in self.jobs[-int(horizon / self.started_every) - 50:]
                if now - job.started <= horizon]

    async def answer(self, client: CoordinatorClient) -> None:
        async for request in client.connect(self.outgoing()):
            stacks = tuple(RankStack(rank, 100_000 + rank, frames=(
                Frame("wait", "train.py", 10),)) for rank in request.ranks)
            self.outbox.put_nowait(StackReply(request.request_id, "soak-node", stacks))
            self.answered += 1


def status(address: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "watchdog", "status", "--json",
                          "--coordinator", address], capture_output=True, text=True,
                         timeout=120, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def verdict_of(address: str, job_id: str) -> dict[str, Any] | None:
    for view in status(address)["jobs"]:
        if view["job_id"] == job_id and view["verdict"] is not None:
            verdict: dict[str, Any] = view["verdict"]
            return verdict
    return None


def comparable(verdict: dict[str, Any]) -> dict[str, Any]:
    return {"kind": verdict["kind"], "culprit_ranks": verdict["culprit_ranks"],
            "waiting_ranks": verdict["waiting_ranks"],
            "summary": verdict["summary"].replace(verdict["job_id"], "JOB").split(" at ")[0]}


async def watch(feeder: Feeder, address: str, proc: psutil.Process) -> list[str]:
    """Samples of RSS and jobs followed, at the start, the middle and the end; the verdicts on
    the first and the last job once they come."""
    lines: list[str] = []
    marks = {"start": min(1000, feeder.total // 10), "middle": feeder.total // 2,
             "end": feeder.total}
    for name, at in marks.items():
        while len(feeder.jobs) < at:
            await asyncio.sleep(0.2)
        followed = len((await asyncio.to_thread(status, address))["jobs"])
        lines.append(f"{name:>6} (job {at:>6}): RSS {proc.memory_info().rss / MIB:6.1f} MiB, "
                     f"jobs followed {followed}")
    return lines


async def judge_edges(feeder: Feeder, address: str) -> None:
    """The verdicts on the first failing job and on the last."""
    last = (feeder.total - 1) // feeder.failing_every * feeder.failing_every
    for n in (0, last):
        while len(feeder.jobs) <= n:
            await asyncio.sleep(0.05)
        job = feeder.jobs[n]
        while job.verdict is None and time.time() - job.started < 30:
            job.verdict = await asyncio.to_thread(verdict_of, address, job.job_id)


async def forgotten(address: str, deadline: float) -> int:
    """The jobs the coordinator still follows once it follows none, or at `deadline`."""
    followed = len((await asyncio.to_thread(status, address))["jobs"])
    while followed and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        followed = len((await asyncio.to_thread(status, address))["jobs"])
    return followed


@dataclass
class Readers:
    """`watchdog incidents list` on the coordinator's database and `watchdog status`, in turn,
    until the feeding ends: what a user, a dashboard or a cron job does meanwhile."""

    db: str
    address: str
    rounds: int = 0
    failures: int = 0

    async def poll(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            listed = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "watchdog", "incidents", "list", "--json",
                                 "--db", self.db], capture_output=True, timeout=120)
            self.failures += listed.returncode != 0
            try:
                await asyncio.to_thread(status, self.address)
            except subprocess.CalledProcessError:
                self.failures += 1
            self.rounds += 1
            await asyncio.sleep(0.5)


async def soak(feeder: Feeder, address: str, proc: psutil.Process,
               readers: Readers) -> list[str]:
    client = CoordinatorClient(address)
    answering = asyncio.create_task(feeder.answer(client))
    edges = asyncio.create_task(judge_edges(feeder, address))
    watching = asyncio.create_task(watch(feeder, address, proc))
    fed = asyncio.Event()
    polling = asyncio.create_task(readers.poll(fed))
    begin = time.monotonic()
    await feeder.feed()
    lines = await watching
    await edges
    fed.set()
    await polling
    silent = time.monotonic()
    followed = await forgotten(address, silent + RETENTION_S + 6)  # it sweeps every 5 s
    lines.append(f"after {time.monotonic() - silent:.0f}s of silence: RSS "
                 f"{proc.memory_info().rss / MIB:6.1f} MiB, jobs followed {followed}")
    lines.append(f"{feeder.total} jobs fed in {time.monotonic() - begin:.0f}s; stack requests "
                 f"answered: {feeder.answered}; readers: {readers.rounds} rounds, "
                 f"{readers.failures} failed")
    lines += verdict_lines(feeder)
    answering.cancel()
    await client.close()
    return lines


def verdict_lines(feeder: Feeder) -> list[str]:
    failing = [job for job in feeder.jobs if job.fails]
    first, last = failing[0].verdict, failing[-1].verdict
    lines = [f"verdict on the {name} failing job: " + (
        json.dumps(comparable(verdict)) if verdict else "none within 30 s")
        for name, verdict in (("first", first), ("last", last))]
    alike = first is not None and last is not None and comparable(first) == comparable(last)
    return [*lines, f"first and last judged alike: {alike}"]


def store_times(store: IncidentStore, texts: list[str]) -> str:
    """Each incident stored again under a new id, as the coordinator stores one (its pruning
    included): the time each took."""
    took = []
    for n, text in enumerate(texts):
        incident = {**json.loads(text), "id": f"again-{n:06d}"}
        began = time.perf_counter()
        store.add(incident)
        took.append(time.perf_counter() - began)
    took.sort()
    return (f"storing an incident ({len(texts)}, {len(store.listed(10 ** 6))} rows after): "
            f"mean {statistics.mean(took) * 1000:.2f} ms, median {took[len(took) // 2] * 1000:.2f} "
            f"ms, p99 {took[int(len(took) * 0.99)] * 1000:.2f} ms")


@contextlib.contextmanager
def database(args: argparse.Namespace, tmp: str) -> Iterator[str]:
    """What the coordinator is given as --db: args.db, a throwaway PostgreSQL server's, or a
    file of its own."""
    if args.postgres:
        from tests.helpers.postgres import cluster

        with cluster() as server:
            yield server.database()
    else:
        yield args.db or os.path.join(tmp, "incidents.db")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--incidents", type=int, default=1_000,
                        help="how many of the jobs fail (one incident each)")
    parser.add_argument("--every", type=float, default=0.01, help="seconds between job starts")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", metavar="PATH|URL", help="store there (an empty database)")
    where.add_argument("--postgres", action="store_true",
                       help="store on a throwaway PostgreSQL server")
    args = parser.parse_args()
    feeder = Feeder(args.jobs, max(1, args.jobs // args.incidents), args.every)
    with tempfile.TemporaryDirectory() as tmp, database(args, tmp) as db:
        os.environ["STATE_DIRECTORY"] = tmp  # a URL's spill file, when it has one
        address = f"127.0.0.1:{free_port()}"
        log = Path(tmp, "coordinator.log")
        with log.open("w") as out:
            coordinator = subprocess.Popen(
                [sys.executable, "-m", "watchdog", "coordinator", "--listen", address, "--db",
                 db, "--keep", str(10 * args.jobs), "--job-retention", str(RETENTION_S)],
                stderr=out)
        store = store_for(database_of(db), Retention(count=10 * args.jobs))
        try:
            while "listening on" not in log.read_text():
                assert coordinator.poll() is None, log.read_text()
                time.sleep(0.1)
            lines = asyncio.run(soak(feeder, address, psutil.Process(coordinator.pid),
                                     Readers(db, address)))
            lines.append(f"database while it ran: {store.used_bytes() / 1024:.0f} KiB (what "
                         "--keep-mib counts)")
        finally:
            coordinator.terminate()
            coordinator.wait(30)
        printed = set(re.findall(r" incident (\S+): ", log.read_text()))
        texts = [stored.text for stored in store.listed(10 ** 6)]
        stored = {json.loads(text)["id"] for text in texts}
        lines.append(store_times(store, texts))
        store.close()
    failing = sum(job.fails for job in feeder.jobs)
    print("\n".join([*lines, f"incidents printed {len(printed)}, stored {len(stored)} "
                     f"({failing} jobs failed), printed and not stored: {len(printed - stored)}"]))


if __name__ == "__main__":
    main()
