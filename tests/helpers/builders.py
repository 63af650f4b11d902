"""Records shaped like those of a 4-rank gloo DDP job (watchdog/demo/train.py), built by the
unit tests of the coordinator: rank states, their collectives, py-spy stacks, job snapshots,
job views, their judgements and an incident.

Each DDP forward enters an "all_reduce" on group "0" that completes at the optimizer step, so at
step 56 the world group stands at #56 completed, and a rank inside step 57 has #57 pending.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from watchdog.coordinator import evidence as _evidence
from watchdog.coordinator.actions import Look
from watchdog.coordinator.incident import build_incident
from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.judgement import Judgement
from watchdog.coordinator.node_silence import NodeSilence
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.verdict import decide
from watchdog.model import (
    DATALOADER_WORKER,
    ChildStack,
    CollectiveRef,
    ExitReason,
    Frame,
    GroupProgress,
    JobSnapshot,
    RankStack,
    RankState,
)
from watchdog.schema import Incident

T0 = 1764676800.0  # 2025-12-02 12:00:00 UTC
JOB = "torchrun-4f2a"
WORLD = (0, 1, 2, 3)
PAIR = (0, 1)  # dist.new_group([0, 1]) is named "1"
SITE = "/opt/venv/lib/python3.11/site-packages"
TRAIN = "/home/ml/train.py"

DDP_BACKWARD = (  # a rank blocked in DDP's gradient all-reduce
    Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 829),
    Frame("backward", f"{SITE}/torch/autograd/__init__.py", 364),
    Frame("backward", f"{SITE}/torch/_tensor.py", 648),
    Frame("main", TRAIN, 112),
    Frame("<module>", TRAIN, 130),
)
DATA_STALL = (  # a rank whose dataset read never returns
    Frame("read_sample_from_storage", TRAIN, 42),
    Frame("__getitem__", TRAIN, 36),
    Frame("fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 52),
    Frame("_next_data", f"{SITE}/torch/utils/data/dataloader.py", 789),
    Frame("__next__", f"{SITE}/torch/utils/data/dataloader.py", 733),
    Frame("main", TRAIN, 104),
    Frame("<module>", TRAIN, 130),
)
BARRIER = (  # rank 0's stray barrier
    Frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 4811),
    Frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
    Frame("save_checkpoint", TRAIN, 58),
    Frame("main", TRAIN, 108),
    Frame("<module>", TRAIN, 130),
)
AFTER_BACKWARD = (  # between its backward and its optimizer step, on a lock it already holds
    Frame("update_metrics", TRAIN, 52),
    Frame("main", TRAIN, 113),
    Frame("<module>", TRAIN, 130),
)
FORWARD_LOOP = (  # stuck in its own model code after DDP's forward counted the all-reduce
    Frame("forward", "/home/ml/model.py", 12),
    Frame("_call_impl", f"{SITE}/torch/nn/modules/module.py", 1784),
    Frame("forward", f"{SITE}/torch/nn/parallel/distributed.py", 1657),
    Frame("main", TRAIN, 110),
)

# Recorded by a `watchdog run` smoke test while the job started on a busy machine.
PACKAGE = Path(_evidence.__file__).parents[1]
IMPORTING_TORCH = (
    Frame("_create_fn", "/root/.pyenv/versions/3.11.7/lib/python3.11/dataclasses.py", 433),
    Frame("<module>", f"{SITE}/torch/compiler/_cache.py", 22),
    Frame("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
    Frame("<module>", f"{SITE}/torch/__init__.py", 2895),
    Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
    Frame("<module>", str(PACKAGE / "demo" / "train.py"), 14),
)
IN_RENDEZVOUS = (
    Frame("_new_process_group_helper", f"{SITE}/torch/distributed/distributed_c10d.py", 2169),
    Frame("init_process_group", f"{SITE}/torch/distributed/distributed_c10d.py", 1899),
    Frame("_time_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 97),
    Frame("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
    Frame("_setting_up.<locals>.wrapper", str(PACKAGE / "hook" / "patches" / "group_setup.py"), 69),
    Frame("main", str(PACKAGE / "demo" / "train.py"), 94),
    Frame("<module>", str(PACKAGE / "demo" / "train.py"), 128),
)


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Summaries print local time: pin it so that they can be compared word for word."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if saved is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = saved
    time.tzset()


def entered(
    seq: int, at: float, op: str = "all_reduce", group: str = "0", ranks: tuple[int, ...] = WORLD
) -> GroupProgress:
    """A collective this rank entered and still waits in."""
    return GroupProgress(group, ranks, seq, op, seq - 1, T0 + at)


def done(
    seq: int, at: float, op: str = "all_reduce", group: str = "0", ranks: tuple[int, ...] = WORLD
) -> GroupProgress:
    """A collective this rank entered and completed."""
    return GroupProgress(group, ranks, seq, op, seq, T0 + at)


def rank(number: int, *groups: GroupProgress, **changes: Any) -> RankState:
    fields: dict[str, Any] = {
        "job_id": JOB, "rank": number, "local_rank": number, "world_size": 4,
        "host": "node-a", "pid": 4242 + number, "hooked": True, "proc_state": "S",
        "heartbeat_age": 0.2, "steps": 56, "events": 120 + number, "last_event_at": T0,
        "groups": groups,
    }  # fmt: skip
    fields.update(changes)
    return RankState(**fields)


def exited(state: RankState, at: float, code: int | None, clean: bool) -> RankState:
    return dataclasses.replace(state, exited_at=T0 + at, exit_code=code, clean_exit=clean,
                               proc_state="")


def snapshot(
    *ranks: RankState, stalled: bool = True, stacks: Mapping[int, tuple[Frame, ...]] | None = None
) -> JobSnapshot:
    taken = {r: RankStack(r, 4242 + r, frames) for r, frames in (stacks or {}).items()}
    return JobSnapshot(JOB, len(ranks), T0 + 45, 42.0 if stalled else 1.0, stalled, ranks, taken)


def unhooked(number: int) -> RankState:
    return rank(number, hooked=False, heartbeat_age=None, steps=0, events=0)


def data_pipeline(
    stalled: bool = True, stacks: Mapping[int, tuple[Frame, ...]] | None = None, **rank1: Any
) -> JobSnapshot:
    """Rank 1's dataset read never returns; 0, 2 and 3 wait in the all-reduce of step 57."""
    return snapshot(
        rank(0, entered(57, 3.1)),
        rank(1, done(56, 2.6), **rank1),
        rank(2, entered(57, 3.2)),
        rank(3, entered(57, 3.4)),
        stalled=stalled,
        stacks=stacks,
    )


def stuck_after_backward(stacks: Mapping[int, tuple[Frame, ...]] | None = None) -> JobSnapshot:
    """Rank 1 finished DDP's all-reduce #57, which Python never sees end, and then blocked
    before its optimizer step; 0, 2 and 3 went on to wait in #58."""
    return snapshot(
        rank(0, entered(58, 3.1)),
        rank(1, entered(57, 2.6)),
        rank(2, entered(58, 3.2)),
        rank(3, entered(58, 3.4)),
        stacks=stacks,
    )


def world_ref(seq: int, op: str = "all_reduce") -> CollectiveRef:
    return CollectiveRef("0", WORLD, seq, op)


WAITS_FOR_ITS_WORKER = (  # rank 1's DataLoader waits for the batch of its worker 1
    Frame("_MultiProcessingDataLoaderIter._try_get_data",
          f"{SITE}/torch/utils/data/dataloader.py", 1291),
    Frame("main", TRAIN, 104),
)
IDLE_WORKER = ChildStack(5000, DATALOADER_WORKER, 0, "S", (
    Frame("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
    Frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 334)))
STUCK_WORKER = ChildStack(5001, DATALOADER_WORKER, 1, "S", (
    Frame("read_shard", "/home/ml/data.py", 16),
    Frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 374)))


def with_children(*kids: ChildStack) -> JobSnapshot:
    job = data_pipeline(stacks={0: DDP_BACKWARD, 1: WAITS_FOR_ITS_WORKER, 2: DDP_BACKWARD,
                                3: DDP_BACKWARD})
    job.stacks[1] = dataclasses.replace(job.stacks[1], children=kids)
    return job


# What every rank of a job raises when its DataLoader gets a DistributedSampler and shuffle=True.
SAMPLER_SHUFFLE = ExitReason(
    "ValueError", "sampler option is mutually exclusive with shuffle",
    (Frame("__init__", f"{SITE}/torch/utils/data/dataloader.py", 375),
     Frame("main", TRAIN, 262), Frame("<module>", TRAIN, 300)))


def raised(number: int, at: float, reason: ExitReason = SAMPLER_SHUFFLE) -> RankState:
    return dataclasses.replace(exited(rank(number, steps=0), at=at, code=1, clean=True),
                               exit_reason=reason)


# -- start-up (coordinator.startup) ---------------------------------------------------------

PREPARING = (  # the demo's init_stall: a rank that prepares its data before joining
    Frame("prepare_dataset", TRAIN, 111),
    Frame("main", TRAIN, 93),
    Frame("<module>", TRAIN, 130),
)


def joining(number: int, age: float = 30.0, **changes: object) -> RankState:
    """A hooked rank inside init_process_group for `age` seconds, no group yet."""
    fields: dict[str, object] = dict(steps=0, events=0, setup="init_process_group",
                                     setup_age=age, rendezvous="env://10.0.0.9:29500")
    fields.update(changes)
    return rank(number, **fields)


# -- a job's view in the coordinator --------------------------------------------------------

POLICY = StallPolicy(warmup=60.0)


def view(*states: RankState, policy: StallPolicy = POLICY) -> JobView:
    job = JobView("job", policy)
    for state in states:
        job.update(f"node-{state.rank // 2}", state)
    return job


def joined(number: int, **changes: object) -> RankState:
    return rank(number, done(56, 2.0), **changes)


def judgement(job_id: str = "job") -> Judgement:
    """A job's judgement, before anything was decided; every node heard from."""
    return Judgement(job_id, NodeSilence(tick=0.25))


def told(judged: Judgement, job: JobView, incident: Incident) -> Judgement:
    """`judged` after a look that told `incident`, as the coordinator tells one."""
    judged.apply(Look(samples=1, early=False, unreachable=(), first=False, reason="a test's"))
    judged.told(incident, job.events_total(), job.exits)
    judged.looked()
    return judged


# -- an incident ----------------------------------------------------------------------------

STACKS = {0: DDP_BACKWARD, 1: DATA_STALL, 2: DDP_BACKWARD, 3: DDP_BACKWARD}
NCCL_LINE = "node-a:4243:4300 [0] misc/socket.cc:49 NCCL WARN socket: connection closed by peer"
# From torch_nccl_timeout.log, as torchrun --tee writes it to the rank's stderr file.
TORCH_LINE = (
    "[rank1]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=80078, OpType=BROADCAST, NumelIn=5056, "
    "NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out."
)


def incident() -> dict[str, object]:
    job = data_pipeline(stacks=STACKS)
    verdict = decide(job)
    assert verdict is not None
    logged = dataclasses.replace(job.stacks[1], nccl_log=(NCCL_LINE,), worker_log=(TORCH_LINE,))
    job = dataclasses.replace(job, stacks={**job.stacks, 1: logged})
    return build_incident(job, verdict, "9c1e04d2b7aa", T0 + 45.25)
