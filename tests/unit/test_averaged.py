"""Replicas whose gradients are averaged without DDP, and losses that turn non-finite: real
models trained in a one-rank gloo group, their all_reduce and backward calls going through the
hook's own wrappers (not installed in torch), the beacon read back and turned into rank states
as the agent does, then compared by the coordinator's findings."""

from __future__ import annotations

import math
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from agent.rankstate import check_evidence
from tests.helpers.builders import JOB, T0, rank
from tests.helpers.recorders import ALL, published, recorder
from watchdog.beacon import BeaconWriter, CheckState, Identity
from watchdog.coordinator.silent_bugs import SETTLE_S, FindingTracker
from watchdog.hook import lifecycle
from watchdog.hook.checks import FIRST_CHECK
from watchdog.hook.losses import MAX_READING, Losses
from watchdog.hook.patches.backward import wrap_backward
from watchdog.hook.patches.c10d import wrap_collective
from watchdog.hook.patches.install import TorchPatches
from watchdog.hook.recorder import Recorder
from watchdog.model import CheckEvidence, JobSnapshot, Kind, RankState

WAYS = ("grads", "bucket", "params", "none")  # what the loop all-reduces after backward


def train(rec: Recorder, way: str, seed: int = 0, n_steps: int = FIRST_CHECK,
          nan_at: int = -1) -> CheckState:
    """A small model trained `n_steps` steps; after backward the loop all-reduces each
    gradient (grads), one buffer its gradients are views of (bucket), each parameter (params:
    local SGD) or nothing; the loss of step `nan_at` made NaN."""
    patches = TorchPatches(rec)
    patches.slots.attach(dist)
    all_reduce = wrap_collective(dist.all_reduce, sys.modules["torch.distributed.distributed_c10d"],
                                 rec, patches.slots, patches.works)
    backward = wrap_backward(torch.Tensor.backward, rec)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    params = list(model.parameters())
    bucket = torch.zeros(sum(p.numel() for p in params))
    optimizer = torch.optim.SGD(params, lr=0.1)
    for step in range(n_steps):
        if way == "bucket":
            bucket.zero_()
            views = bucket.split([p.numel() for p in params])
            for p, view in zip(params, views, strict=True):
                p.grad = view.view_as(p)
        else:
            optimizer.zero_grad()
        loss = model(torch.ones(4, 8)).pow(2).mean()
        backward(loss * math.nan if step == nan_at else loss)
        reduced = {"grads": [p.grad for p in params], "bucket": [bucket],
                   "params": [p.data for p in params], "none": []}[way]
        for tensor in reduced:
            all_reduce(tensor)
        optimizer.step()
        rec.optimizer_stepped(optimizer, (), {})  # the global step hook, not installed here
    return published(rec)


@pytest.mark.parametrize(("way", "averaged"), [
    ("grads", True), ("bucket", True), ("params", False), ("none", False)])
def test_the_parameters_whose_gradients_were_all_reduced_are_fingerprinted(
        one_rank: None, tmp_path: Path, way: str, averaged: bool) -> None:
    prints = train(recorder(tmp_path), way).fingerprints
    expected = [("optimizer", dist.group.WORLD.group_name, 0, FIRST_CHECK)] if averaged else []
    assert [(fp.of, fp.group, fp.module, fp.step) for fp in prints] == expected


def state(number: int, checks: CheckState) -> RankState:
    return rank(number, steps=FIRST_CHECK, evidence=check_evidence(checks))


def judge(tracker: FindingTracker, *states: RankState, now: float = T0) -> list[Any]:
    for s in states:
        tracker.observe(s)
    return tracker.evaluate(JobSnapshot(JOB, 4, T0, 0.0, False, states), now)


def test_replicas_seeded_each_their_own_way_all_differ(one_rank: None, tmp_path: Path) -> None:
    ranks = [state(r, train(recorder(tmp_path, name=f"r{r}"), "grads", seed=r))
             for r in range(4)]
    (finding,) = judge(FindingTracker(), *ranks)
    assert (finding.kind, finding.culprit_ranks, finding.step) == (
        Kind.REPLICA_DESYNC, (0, 1, 2, 3), FIRST_CHECK)
    assert finding.summary == (
        "ranks 0-3: the parameters optimizer 0 steps (gradients averaged by hand) all differ at "
        "step 8; the replicas of group 0 (world) are out of sync")
    alike = [state(r, train(recorder(tmp_path, name=f"a{r}"), "grads"))
             for r in range(4)]
    assert judge(FindingTracker(), *alike) == []


def test_the_first_non_finite_loss_is_read_by_the_publisher(one_rank: None,
                                                            tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    checks = train(rec, "grads", n_steps=6, nan_at=3)
    assert checks.nonfinite_step == 3 and math.isnan(checks.nonfinite_value)
    losses = rec.checks.losses
    assert not losses.watching and not losses.read  # nothing more is kept once one is found
    off = recorder(tmp_path, ALL - {"nonfinite_loss"}, "off")
    assert train(off, "grads", n_steps=6, nan_at=3).nonfinite_step == -1
    assert not off.checks.losses.waiting


def test_the_publisher_thread_reads_the_kept_losses_between_its_publishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loss held until the next publish (0.2 s) costs the training thread; it is read by an
    earlier round of the publisher thread, and the NaN among them is found all the same."""
    rec = recorder(tmp_path)
    backward = wrap_backward(torch.Tensor.backward, rec)
    model = torch.nn.Linear(8, 1)
    for step in range(3):
        loss = model(torch.ones(4, 8)).mean()
        backward(loss * math.nan if step == 2 else loss)
        rec.optimizer_stepped(None)
    left_at_publish: list[int] = []
    publish, stop = Recorder.publish, threading.Event()

    def publish_once(self: Recorder) -> None:
        left_at_publish.append(len(self.checks.losses.waiting))
        publish(self)
        stop.set()

    monkeypatch.setattr(Recorder, "publish", publish_once)
    thread = threading.Thread(target=lifecycle._publish_forever, args=(rec, stop))
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert left_at_publish == [0]
    assert rec.checks.losses.first[0] == 2 and math.isnan(rec.checks.losses.first[1])


def test_a_loss_read_dies_at_the_next_backward_or_else_at_the_next_read(
        tmp_path: Path) -> None:
    """The training thread drops what the publisher has read (its graph is freed where it was
    made); with no backward since, the next read round drops it; a failed hook keeps none."""
    rec = recorder(tmp_path)
    backward = wrap_backward(torch.Tensor.backward, rec)
    model = torch.nn.Linear(8, 1)

    def step() -> weakref.ref[torch.Tensor]:
        loss = model(torch.ones(4, 8)).mean()
        backward(loss)
        return weakref.ref(loss)

    first = step()
    assert first() is not None  # kept for the publisher
    rec.read_losses()
    assert first() is not None and rec.checks.losses.read  # read: back to the training thread
    second = step()
    assert first() is None and second() is not None
    rec.read_losses()
    assert second() is not None
    rec.read_losses()  # no backward() in between
    assert second() is None and not rec.checks.losses.read
    rec.fail(RuntimeError("a fault in the hook"))
    third = step()
    assert third() is None and not rec.checks.losses.waiting


class _DeviceBehind:
    """A CUDA read-back whose event has not fired yet: the device is held busy."""

    def __init__(self, value: float) -> None:
        self.done, self.value = False, value

    def ready(self) -> bool:
        return self.done

    def numbers(self) -> list[float]:
        return [self.value]


def test_losses_wait_for_a_busy_device_rather_than_a_read_back_be_dropped() -> None:
    """With MAX_READING read-backs in flight, the next losses stay kept; the oldest read-back,
    whose loss was the NaN, is read once the device catches up."""
    losses = Losses()
    losses.watching = True
    behind = [_DeviceBehind(math.nan if step == 0 else 1.0) for step in range(MAX_READING)]
    losses._reading.extend(([step], values) for step, values in enumerate(behind))
    losses.waiting.append((MAX_READING, torch.tensor(2.0)))
    losses.collect(torch)
    assert len(losses._reading) == MAX_READING and len(losses.waiting) == 1
    for values in behind:
        values.done = True
    losses.collect(torch)
    assert losses.first[0] == 0 and math.isnan(losses.first[1])


def lost(number: int, at: int, steps: int) -> RankState:
    evidence = CheckEvidence(checks=("nonfinite_loss",), nonfinite_step=at,
                             nonfinite_value=math.inf)
    return rank(number, steps=steps, evidence=evidence)


def test_the_first_rank_whose_loss_is_non_finite_is_named_once_its_peers_were_finite() -> None:
    tracker = FindingTracker()
    behind = [lost(0, -1, 31), lost(1, -1, 40), lost(2, 30, 31), lost(3, -1, 30)]
    assert judge(tracker, *behind) == []  # rank 3 has not read its loss of step 30 yet
    assert tracker.pending
    (finding,) = judge(tracker, lost(0, 31, 32), lost(1, -1, 40), lost(2, 30, 31),
                       lost(3, 31, 32))
    assert (finding.kind, finding.culprit_ranks, finding.step) == (Kind.NONFINITE_LOSS, (2,), 30)
    assert finding.summary == ("rank 2: the loss was inf at step 30 while ranks 0,1,3's were "
                               "finite (the job's first non-finite loss)")
    assert not tracker.pending and judge(tracker, lost(2, 30, 40)) == []


def test_a_loss_non_finite_everywhere_at_once_names_no_rank() -> None:
    tracker = FindingTracker()
    assert judge(tracker, *(lost(r, 12, 13) for r in range(4))) == []
    assert not tracker.pending
    late = FindingTracker()  # rank 3 never reads its loss of step 12: decided after SETTLE_S
    states = [lost(r, 12, 13) for r in range(3)] + [lost(3, -1, 5)]
    assert judge(late, *states) == []
    assert judge(late, *states, now=T0 + SETTLE_S) == []
    assert not late.pending


def test_an_armed_process_runs_the_checks_it_learns_when_it_becomes_a_rank(
        one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As under mp.spawn: torch is patched before the process knows its rank and checks."""
    for name in ("__init__", "forward"):  # restored after the test
        monkeypatch.setattr(DistributedDataParallel, name, getattr(DistributedDataParallel, name))
    armed = Recorder()
    TorchPatches(armed).patch_ddp(sys.modules["torch.nn.parallel.distributed"])
    identity = Identity("j", 0, 0, 1, "h", 1, 0.0)
    armed.start(BeaconWriter(str(tmp_path / "armed.beacon"), identity), identity, ALL)
    ddp = DistributedDataParallel(torch.nn.Linear(8, 4))
    for _ in range(FIRST_CHECK):
        ddp(torch.ones(2, 8)).sum().backward()
        armed.optimizer_stepped(None, None, None)
    ddp(torch.ones(2, 8)).sum().backward()  # the batch after the check
    assert sorted(fp.of for fp in published(armed).fingerprints) == ["batch", "parameters"]
