"""torch.compile under the hook, in this process (real torch, a one-rank gloo group): compiled
code is what it would be without the hook, recompiles nothing, counts what eager code counts;
and the beacon says while the rank compiles."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.distributed as dist
from torch._dynamo.callback import CallbackTrigger, callback_handler
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from tests.helpers.recorders import recorder
from watchdog.beacon import BeaconSnapshot, open_beacon, read_beacon
from watchdog.collectives import COLLECTIVES, POINT_TO_POINT
from watchdog.hook.checks import FIRST_CHECK
from watchdog.hook.patches import ddp
from watchdog.hook.patches.install import TorchPatches
from watchdog.hook.recorder import Recorder

STEPS = FIRST_CHECK + 4  # the checks run in the compiled loop too
NAN_AT = FIRST_CHECK + 1
DDP_INIT_COLLECTIVES = 2  # the parameter shape check and broadcast, on DDP's group
SET_UP = ("batch_isend_irecv", "init_process_group", "new_group", "destroy_process_group")


@pytest.fixture
def hook(one_rank: None, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Recorder]]:
    """Installs the hook's patches in this process's torch as a rank gets them, torch.compile's
    included; torch's functions and dynamo's caches and callbacks are as they were after."""
    c10d, ddp_module = dist.distributed_c10d, sys.modules["torch.nn.parallel.distributed"]
    patched = [(owner, name) for owner in (dist, c10d)
               for name in (*COLLECTIVES, *POINT_TO_POINT, *SET_UP) if hasattr(owner, name)]
    patched += [(c10d.Work, "wait"), (DistributedDataParallel, "forward"),
                (DistributedDataParallel, "__init__"), (DistributedSampler, "__iter__"),
                (torch.Tensor, "backward"), (torch.optim.Optimizer, "_optimizer_step_code"),
                *((ddp_module, name) for name in ddp.DDP_INIT_CALLS)]
    for owner, name in patched:
        monkeypatch.setattr(owner, name, getattr(owner, name))

    def install() -> Recorder:
        torch._dynamo.reset()
        rec = recorder(tmp_path)
        for module, patch in TorchPatches(rec).post_import_hooks().items():
            patch(sys.modules[module])
        return rec

    yield install
    torch._dynamo.reset()


def snapshot(rec: Recorder) -> BeaconSnapshot:
    rec.publish()
    assert rec.writer is not None
    return read_beacon(open_beacon(rec.writer.path))


def train(how: str) -> None:
    """STEPS steps of a DDP module, its loss made NaN at NAN_AT: eager, the DDP module compiled
    (outer), the module it wraps (inner), or the whole step (step)."""
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4)
    model: Any = DistributedDataParallel(
        torch.compile(net, backend="eager") if how == "inner" else net)
    model = torch.compile(model, backend="eager") if how == "outer" else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scale = torch.ones(())

    def step(batch: torch.Tensor) -> torch.Tensor:
        loss = model(batch).pow(2).mean() * scale
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    step = torch.compile(step, backend="eager") if how == "step" else step
    for n in range(STEPS):
        scale.fill_(float("nan") if n == NAN_AT else 1.0)
        step(torch.ones(2, 8))


@pytest.mark.parametrize("how", ["eager", "outer", "inner", "step"])
def test_compiled_ddp_training_counts_what_eager_counts_and_recompiles_nothing(
        hook: Callable[[], Recorder], how: str) -> None:
    rec = hook()
    with torch._dynamo.config.patch(error_on_recompile=True):
        train(how)
    snap = snapshot(rec)
    assert rec.enabled
    assert snap.steps == STEPS
    (world,) = snap.groups
    assert world.entered_seq == DDP_INIT_COLLECTIVES + STEPS  # each forward, as a collective
    assert snap.checks.nonfinite_step == NAN_AT  # each loss kept as backward() was called
    assert {fp.of for fp in snap.checks.fingerprints} == {"parameters", "batch"}


def graphs() -> tuple[int, int, int]:
    """What dynamo compiled and broke on since the last reset."""
    stats = counters["stats"]
    return (stats["unique_graphs"], stats["calls_captured"],
            sum(counters["graph_break"].values()))


def test_compiled_code_is_what_it_would_be_without_the_hook(
        hook: Callable[[], Recorder]) -> None:
    torch._dynamo.reset()
    counters.clear()
    train("step")
    unhooked = graphs()
    hook()
    counters.clear()
    train("step")
    assert graphs() == unhooked


def test_a_collective_in_a_full_graph_is_the_graphs_own(hook: Callable[[], Recorder]) -> None:
    """Dynamo makes it a functional collective: compiled, it goes unrecorded."""
    rec = hook()

    def summed(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor * 2

    compiled = torch.compile(summed, backend="eager", fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert [compiled(torch.ones(2)).tolist() for _ in range(3)] == [[2.0, 2.0]] * 3
    assert rec.enabled
    assert [group.entered_seq for group in snapshot(rec).groups] == [0]


def test_a_collective_compiled_code_breaks_at_is_recorded(hook: Callable[[], Recorder]) -> None:
    rec = hook()

    def shared(tensor: torch.Tensor) -> torch.Tensor:
        dist.broadcast(tensor, 0)
        return tensor + 1

    compiled = torch.compile(shared, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            compiled(torch.ones(2))
    (world,) = snapshot(rec).groups
    assert (world.op, world.entered_seq, world.completed_seq) == ("broadcast", 3, 3)


def test_a_compiled_optimizer_step_is_counted(hook: Callable[[], Recorder]) -> None:
    rec = hook()
    net = torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam(net.parameters())
    step = torch.compile(optimizer.step, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(STEPS):
            net(torch.ones(2, 8)).sum().backward()
            step()
    assert rec.enabled and snapshot(rec).steps == STEPS


def test_a_compile_is_in_the_beacon_while_it_runs(hook: Callable[[], Recorder]) -> None:
    """A forward compile, then the backward compiled on its first use (aot_eager)."""
    rec = hook()
    seen: list[tuple[str, float]] = []

    def look(args: Any) -> None:  # called after the hook's own start callback
        seen.append((args.callback_trigger.name, snapshot(rec).compiling_since))

    callback_handler.register_start_callback(look)
    began = time.time()
    torch.compile(torch.nn.Linear(4, 1), backend="aot_eager")(torch.ones(2, 4)).sum().backward()
    assert [trigger for trigger, _ in seen] == ["DYNAMO", "LAZY_BACKWARD"]
    assert all(began <= since <= time.time() for _, since in seen)
    assert snapshot(rec).compiling_since == 0.0


def test_recording_a_cuda_graph_is_no_compile(hook: Callable[[], Recorder]) -> None:
    """It runs the graph, and any collective in it: a rank hung there is no rank at work."""
    rec = hook()
    with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
        assert rec.compiling_since == 0.0
    with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "0/0"):
        assert rec.compiling_since > 0.0
    assert rec.compiling_since == 0.0
