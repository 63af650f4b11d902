"""The hook's recorder on a real beacon in this process, and a real DDP module in a one-rank
gloo group: what the unit tests of the silent-bug checks and of the findings train."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from watchdog.beacon import (
    CHECK_NAMES,
    BeaconWriter,
    CheckState,
    Identity,
    open_beacon,
    read_beacon,
)
from watchdog.hook.recorder import Recorder

ALL = frozenset(CHECK_NAMES)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A gloo process group of this process alone: DDP needs one."""
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def ddp_linear(seed: int = 0) -> DistributedDataParallel:
    torch.manual_seed(seed)
    return DistributedDataParallel(torch.nn.Linear(8, 4))


def recorder(tmp_path: Path, checks: frozenset[str] = ALL, name: str = "r") -> Recorder:
    identity = Identity("j", 0, 0, 1, "h", os.getpid(), 0.0)
    rec = Recorder(BeaconWriter(str(tmp_path / f"{name}.beacon"), identity), identity, checks)
    rec.checks.torch = torch
    return rec


def steps(rec: Recorder, n: int) -> None:
    for _ in range(n):
        rec.optimizer_stepped(None, None, None)


def published(rec: Recorder) -> CheckState:
    """What the recorder's checks publish, read back from its beacon."""
    rec.publish()
    assert rec.writer is not None
    return read_beacon(open_beacon(rec.writer.path)).checks
