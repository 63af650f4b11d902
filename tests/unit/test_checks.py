"""The hook's silent-bug checks on real torch objects, in this process: a DDP module in a
one-rank gloo group, a DistributedSampler, real tensors. What reaches the beacon is read back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from tests.helpers.recorders import (
    ALL,
    ddp_linear,
    published,
    recorder,
    steps,
)
from watchdog.beacon import (
    CHECK_NAMES,
)
from watchdog.hook.checks import (
    CHECK_EVERY,
    FIRST_CHECK,
    batch_values,
    next_check,
    parameter_values,
    parse_checks,
)
from watchdog.hook.patches.install import TorchPatches
from watchdog.model import CHECK_KINDS


@pytest.mark.parametrize(("text", "enabled", "unknown"), [
    ("", ALL, []),
    ("-duplicate_data", ALL - {"duplicate_data"}, []),
    ("-duplicate_data, -no_grad_sync", ALL - {"duplicate_data", "no_grad_sync"}, []),
    ("none,replica_desync", {"replica_desync"}, []),
    ("none,+sampler_epoch_reused", {"sampler_epoch_reused"}, []),
    ("none", set(), []),
    ("-replica_desync,all", ALL, []),
    ("-duplicate_dat,bogus", ALL, ["-duplicate_dat", "bogus"]),
])
def test_watchdog_checks_switches_checks_off_and_on(text: str, enabled: set[str],
                                                    unknown: list[str]) -> None:
    assert parse_checks(text) == (frozenset(enabled), unknown)


def test_the_checks_are_named_for_their_findings_in_one_order() -> None:
    assert tuple(kind.check for kind in CHECK_KINDS) == CHECK_NAMES


def test_checks_come_early_then_every_k_steps() -> None:
    due, schedule = 0, []
    while due < 500:
        due = next_check(due, CHECK_EVERY)
        schedule.append(due)
    assert schedule[:8] == [FIRST_CHECK, 16, 32, 64, 128, 256, 456, 656]
    assert next_check(FIRST_CHECK, 5) == FIRST_CHECK + 5


def test_replicas_in_sync_give_equal_fingerprints_and_a_loaded_one_another(
        one_rank: None, tmp_path: Path) -> None:
    prints = []
    for name, load in (("a", False), ("b", False), ("c", True)):
        rec, ddp = recorder(tmp_path, name=name), ddp_linear()
        rec.checks.wrapped(ddp)
        if load:  # a checkpoint loaded on this replica only, after wrapping
            ddp.module.load_state_dict(torch.nn.Linear(8, 4).state_dict())
        steps(rec, FIRST_CHECK)
        (fingerprint,) = published(rec).fingerprints
        assert (fingerprint.of, fingerprint.group, fingerprint.module, fingerprint.step) == (
            "parameters", "0", 0, FIRST_CHECK)
        prints.append(fingerprint.digest)
    assert prints[0] == prints[1] != prints[2]


def test_a_sign_flip_and_one_changed_value_change_the_fingerprint(one_rank: None) -> None:
    ddp = ddp_linear()
    params = [p for p in ddp.parameters()]

    def values() -> list[float]:
        with torch.no_grad():
            numbers = parameter_values(torch, params, 0)
        assert numbers is not None
        return list(numbers.tolist())

    before = values()
    with torch.no_grad():
        params[0].neg_()
    flipped = values()
    with torch.no_grad():
        params[0].neg_()
        params[0][3, 5] += 1e-3
    assert before != flipped and before != values()


def test_batches_are_fingerprinted_at_the_first_forward_after_a_check(one_rank: None,
                                                                      tmp_path: Path) -> None:
    rec, ddp = recorder(tmp_path, frozenset({"duplicate_data"})), ddp_linear()
    rec.checks.wrapped(ddp)
    batch = torch.arange(32.0).reshape(4, 8)
    steps(rec, FIRST_CHECK - 1)
    assert not rec.checks.batch_due
    steps(rec, 1)
    assert rec.checks.batch_due
    rec.checks.batch(ddp, (batch,), {})
    rec.checks.batch(ddp, (batch + 1,), {})  # a second forward in the same step: not taken
    assert not rec.checks.batch_due
    (fingerprint,) = published(rec).fingerprints
    assert (fingerprint.of, fingerprint.step) == ("batch", FIRST_CHECK)


def test_the_patched_ddp_takes_a_training_batch_not_an_evaluations(
        one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("__init__", "forward"):  # restored after the test
        monkeypatch.setattr(DistributedDataParallel, name, getattr(DistributedDataParallel, name))
    rec = recorder(tmp_path)
    TorchPatches(rec).patch_ddp(sys.modules["torch.nn.parallel.distributed"])
    ddp = ddp_linear()  # the patched constructor hands it to the checks
    steps(rec, FIRST_CHECK)
    batch = torch.ones(2, 8)
    with torch.no_grad():
        ddp(batch)  # an evaluation: every rank may well see the same batch
    assert rec.checks.batch_due and rec.grad_syncs == 0
    ddp(batch).sum().backward()
    assert not rec.checks.batch_due and rec.grad_syncs == 1
    assert sorted(fp.of for fp in published(rec).fingerprints) == ["batch", "parameters"]


def test_batch_values_cover_every_input_tensor_and_its_shape() -> None:
    tokens, mask = torch.arange(4096).reshape(8, 512), torch.ones(8, 512, dtype=torch.bool)
    with torch.no_grad():
        values, shapes = batch_values(torch, (tokens,), {"mask": mask, "scale": 0.5})
    assert values is not None and values.dtype == torch.float64 and len(values) == 128
    assert values[:2].tolist() == [0.0, 64.0]  # strided over the whole tensor
    assert b"(8, 512)" in shapes and b"torch.bool" in shapes
    other, _ = batch_values(torch, (tokens + 1,), {"mask": mask})
    assert other is not None and not torch.equal(values, other)
    assert batch_values(torch, ("no tensor",), {}) == (None, b"")


def test_a_ddp_module_cast_after_wrapping_is_seen_at_the_next_check(one_rank: None,
                                                                    tmp_path: Path) -> None:
    rec, ddp = recorder(tmp_path, frozenset({"ddp_module_changed"})), ddp_linear()
    rec.checks.wrapped(ddp)
    steps(rec, FIRST_CHECK)
    assert published(rec).ddp_change_step == 0
    ddp.double()
    steps(rec, 16 - FIRST_CHECK)
    state = published(rec)
    assert (state.ddp_change_step, state.ddp_change_module, state.ddp_change_group) == (16, 0, "0")
    assert state.ddp_change == "dtype of weight: torch.float32 -> torch.float64"


def test_a_parameter_replaced_after_wrapping_is_a_change(one_rank: None, tmp_path: Path) -> None:
    rec, ddp = recorder(tmp_path, frozenset({"ddp_module_changed"})), ddp_linear()
    rec.checks.wrapped(ddp)
    ddp.module.bias = torch.nn.Parameter(torch.zeros(4))
    steps(rec, FIRST_CHECK)
    assert published(rec).ddp_change == "parameter bias was replaced"


def test_a_shuffling_sampler_iterated_through_twice_with_one_epoch_is_a_reuse(
        tmp_path: Path) -> None:
    rec = recorder(tmp_path, frozenset({"sampler_epoch_reused"}))
    sampler = DistributedSampler(range(40), num_replicas=4, rank=1)
    ordered = DistributedSampler(range(40), num_replicas=4, rank=1, shuffle=False)

    def epoch(of: DistributedSampler[int], peek: bool = False) -> None:
        iterator = iter(of)
        rec.checks.sampler_iterated(of, iterator)
        for _ in [next(iterator)] if peek else iterator:
            pass

    epoch(sampler, peek=True)  # a first batch looked at before training: not an epoch
    epoch(sampler)
    sampler.set_epoch(1)
    epoch(sampler)
    for _ in range(3):
        epoch(ordered)  # no shuffle: the same order is what it promises
    steps(rec, 5)
    assert published(rec).sampler_reuses == 0
    epoch(sampler)
    state = published(rec)
    assert (state.sampler_reuses, state.sampler_reuse_step, state.sampler_epoch) == (1, 5, 1)


def test_steps_before_the_first_gradient_collective_are_counted_by_the_publisher(
        tmp_path: Path) -> None:
    rec = recorder(tmp_path, frozenset({"no_grad_sync"}))
    steps(rec, 3)
    assert published(rec).unsynced_steps == 3
    rec.grad_synced()
    steps(rec, 1)
    assert published(rec).unsynced_steps == 0
    steps(rec, 49)  # local SGD: the parameters averaged from time to time, not every step
    assert published(rec).unsynced_steps == 0
    assert published(recorder(tmp_path, frozenset(), "off")).unsynced_steps == 0


def test_with_every_check_off_a_step_never_runs_one(tmp_path: Path) -> None:
    rec = recorder(tmp_path, frozenset({"no_grad_sync", "sampler_epoch_reused"}))
    steps(rec, 200)
    state = published(rec)
    assert (state.taken, state.fingerprints, state.enabled) == (
        0, (), ("no_grad_sync", "sampler_epoch_reused"))
