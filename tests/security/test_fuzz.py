"""Property-based fuzzing of everything a daemon reads from outside: beacon files (random bytes,
truncated and regrown while the agent holds them, junk beside them) under a live agent, every
RPC message a coordinator receives, and every message an agent receives from a coordinator.
After each run the daemons are alive and still doing their job."""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.attack import (
    AS_NOBODY,
    NOBODY,
    Daemon,
    agent,
    coordinator,
    job,
    scratch_dir,
    shared_base,
    wait_for,
)
from tests.helpers.attack import worker as fake_worker
from tests.helpers.scrape import scrape, value
from watchdog.beacon import SIZE
from watchdog.cli.demo import free_port
from watchdog.transport.proto import watchdog_pb2 as pb
from watchdog.transport.proto import watchdog_pb2_grpc as pb_grpc

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                derandomize=True)

texts = st.text(max_size=80) | st.sampled_from(["", "\x1b[2J", "\0", "x" * 5000])
int32 = st.integers(-(2**31), 2**31 - 1)
uint64 = st.integers(0, 2**64 - 1)
doubles = st.floats(allow_nan=True, allow_infinity=True)


# -- beacon files under a live agent ---------------------------------------------------------

class Node:
    def __init__(self, scratch: Path, coord: Daemon, node: Daemon, target: Path,
                 metrics: int) -> None:
        self.scratch, self.coord, self.node, self.target = scratch, coord, node, target
        self.metrics = metrics  # the coordinator's /metrics port

    def reports(self) -> float:
        """Node reports the coordinator took: each one follows a scan of the agent's."""
        return value(scrape(self.metrics), "torch_hang_watchdog_reports_total") or 0.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
        spec = {"beacon_dir": str(beacons), "rank": 0, "world": 1}
        metrics = free_port()
        with coordinator(scratch, "--metrics-listen", f"127.0.0.1:{metrics}") as coord, \
                fake_worker({**spec, "job": "fuzzed"}, AS_NOBODY), \
                agent(scratch, beacons, "--coordinator", coord.address,
                      "--interval", "0.05") as node:
            wait_for(lambda: job(coord.address, "fuzzed"), "the fuzzed job to be reported")
            (target,) = (beacons / str(NOBODY)).glob("fuzzed.*.beacon")
            yield Node(scratch, coord, node, target, metrics)


operations = st.lists(st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 2 * SIZE)),
    st.tuples(st.just("write"), st.integers(0, SIZE), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("junk"), st.integers(0, 3), st.binary(max_size=SIZE + 8)),
    st.tuples(st.just("damaged copy"), st.integers(0, 3), st.integers(0, SIZE - 8),
              st.binary(min_size=1, max_size=8)),
), min_size=1, max_size=6)


@settings(FUZZ, max_examples=40)
@given(ops=operations)
def test_beacon_files_of_any_content_leave_the_agent_alive(
        live: Node, ops: list[tuple[object, ...]]) -> None:
    directory = live.target.parent
    for op in ops:
        if op[0] == "truncate":
            os.truncate(live.target, op[1])
        elif op[0] == "write":
            with live.target.open("r+b") as f:
                f.seek(op[1])
                f.write(op[2])
        else:
            path = directory / f"junk{op[1]}.beacon"
            content = op[2] if op[0] == "junk" else _damaged(live.target, op[2], op[3])
            path.write_bytes(content)
            os.chown(path, NOBODY, -1)
    # Two scans of the agent: the first report taken from now on may come from a scan begun
    # before, the next two from scans begun after.
    taken = live.reports()
    wait_for(lambda: live.reports() >= taken + 3 or not live.node.alive, "two scans of the agent")
    assert live.node.alive, live.node.output()


def _damaged(source: Path, offset: int, data: bytes) -> bytes:
    whole = bytearray(source.read_bytes().ljust(SIZE, b"\0")[:SIZE])
    whole[offset:offset + len(data)] = data
    return bytes(whole)


def test_after_the_fuzzing_the_agent_still_reports(live: Node) -> None:
    spec = {"beacon_dir": str(live.target.parent.parent), "rank": 0, "world": 1}
    with fake_worker({**spec, "job": "after-the-fuzzing"}):
        wait_for(lambda: job(live.coord.address, "after-the-fuzzing"), "a new job's report")
    assert live.node.alive
    assert "Traceback" not in live.node.output()


# -- every message a coordinator receives ---------------------------------------------------

frames = st.builds(pb.Frame, function=texts, file=texts, line=int32)
groups = st.builds(pb.GroupProgress, group=texts, ranks=st.lists(int32, max_size=4),
                   entered_seq=uint64, entered_op=texts, completed_seq=uint64,
                   entered_at=doubles)
rank_states = st.builds(
    pb.RankState, job_id=texts, rank=int32, local_rank=int32, world_size=int32, host=texts,
    pid=int32, hooked=st.booleans(), proc_state=texts, heartbeat_age=doubles, steps=uint64,
    events=uint64, last_event_at=doubles, groups=st.lists(groups, max_size=3), phase=texts,
    phase_age=doubles, phase_timeout=doubles, exited_at=doubles, exit_code=int32,
    clean_exit=st.booleans())
reports = st.builds(pb.NodeReport, node=texts, sent_at=doubles,
                    ranks=st.lists(rank_states, max_size=4))
stacks = st.builds(pb.RankStack, rank=int32, pid=int32, frames=st.lists(frames, max_size=4),
                   error=texts, was_stopped=st.booleans(), nccl_log=st.lists(texts, max_size=3),
                   worker_log=st.lists(texts, max_size=3))
replies = st.builds(pb.StackReply, request_id=uint64, node=texts,
                    stacks=st.lists(stacks, max_size=3))
agent_messages = (st.builds(pb.AgentMessage, report=reports)
                  | st.builds(pb.AgentMessage, stacks=replies)
                  | st.just(pb.AgentMessage()))


@pytest.fixture(scope="module")
def hub() -> Iterator[Daemon]:
    with scratch_dir() as scratch, coordinator(scratch) as coord:
        yield coord


@settings(FUZZ, max_examples=60)
@given(messages=st.lists(agent_messages, min_size=1, max_size=5),
       job_id=texts.filter(lambda t: len(t) <= 4096))
def test_any_agent_message_or_status_request_leaves_the_coordinator_serving(
        hub: Daemon, messages: list[pb.AgentMessage], job_id: str) -> None:
    with grpc.insecure_channel(hub.address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        for _ in stub.Connect(iter(messages), timeout=20):
            pass
        stub.Status(pb.StatusRequest(job_id=job_id), timeout=20)
    assert hub.alive


def test_after_the_fuzzing_the_coordinator_still_takes_reports(hub: Daemon) -> None:
    now = time.time()
    good = pb.AgentMessage(report=pb.NodeReport(node="node-z", sent_at=now, ranks=[pb.RankState(
        job_id="after-the-fuzzing", rank=0, world_size=1, host="node-z", pid=1, hooked=True,
        steps=1, events=1, last_event_at=now)]))
    with grpc.insecure_channel(hub.address) as channel:
        for _ in pb_grpc.CoordinatorStub(channel).Connect(iter([good]), timeout=20):
            pass
    assert job(hub.address, "after-the-fuzzing") is not None
    assert hub.alive and "Traceback" not in hub.output()


# -- every message an agent receives ---------------------------------------------------------

coordinator_messages = (st.builds(pb.CoordinatorMessage, stack_request=st.builds(
    pb.StackRequest, request_id=uint64, job_id=texts | st.just("fuzzed-by-coordinator"),
    ranks=st.lists(int32 | st.just(0), max_size=4))) | st.just(pb.CoordinatorMessage()))


class FakeCoordinator(pb_grpc.CoordinatorServicer):
    """Sends whatever the test queues to the agent that connects; counts what comes back."""

    def __init__(self) -> None:
        self.outgoing: queue.Queue[pb.CoordinatorMessage] = queue.Queue()
        self.reports = 0
        self.answers = 0

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],
                      context: grpc.aio.ServicerContext[pb.AgentMessage, pb.CoordinatorMessage]
                      ) -> AsyncIterator[pb.CoordinatorMessage]:
        await context.send_initial_metadata((("watchdog-accepted", "1"),))
        reader = asyncio.create_task(self._count(request_iterator))
        while not reader.done():
            try:
                yield await asyncio.to_thread(self.outgoing.get, True, 0.1)
            except queue.Empty:
                continue

    async def _count(self, messages: AsyncIterator[pb.AgentMessage]) -> None:
        async for message in messages:
            self.reports += message.HasField("report")
            self.answers += message.HasField("stacks")


@pytest.fixture(scope="module")
def fed_agent() -> Iterator[tuple[FakeCoordinator, Daemon]]:
    fake = FakeCoordinator()
    ready = threading.Event()
    stop: asyncio.Future[None] | None = None
    address: list[str] = []

    async def serve() -> None:
        nonlocal stop
        server = grpc.aio.server()
        pb_grpc.add_CoordinatorServicer_to_server(fake, server)
        address.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        await server.start()
        stop = asyncio.get_running_loop().create_future()
        ready.set()
        await stop
        await server.stop(0.5)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(30)
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
        spec = {"beacon_dir": str(beacons), "rank": 0, "world": 1, "job": "fuzzed-by-coordinator"}
        with fake_worker(spec, AS_NOBODY), \
                agent(scratch, beacons, "--coordinator", address[0]) as node:
            wait_for(lambda: fake.reports > 2, "the agent's reports")
            yield fake, node
    assert stop is not None
    loop.call_soon_threadsafe(stop.set_result, None)
    thread.join(10)


@settings(FUZZ, max_examples=40)
@given(messages=st.lists(coordinator_messages, min_size=1, max_size=5))
def test_any_coordinator_message_leaves_the_agent_alive(
        fed_agent: tuple[FakeCoordinator, Daemon], messages: list[pb.CoordinatorMessage]) -> None:
    fake, node = fed_agent
    for message in messages:
        fake.outgoing.put(message)
    assert node.alive


def test_after_the_fuzzing_the_agent_still_reports_and_answers(
        fed_agent: tuple[FakeCoordinator, Daemon]) -> None:
    fake, node = fed_agent
    wait_for(lambda: fake.outgoing.empty(), "the queued messages to go out")
    reports, answers = fake.reports, fake.answers
    time.sleep(1.1)  # past the agent's once-a-second budget for the job
    fake.outgoing.put(pb.CoordinatorMessage(stack_request=pb.StackRequest(
        request_id=1, job_id="fuzzed-by-coordinator", ranks=[0])))
    wait_for(lambda: fake.reports > reports + 2 and fake.answers > answers, "reports, answers")
    assert node.alive and "Traceback" not in node.output()
