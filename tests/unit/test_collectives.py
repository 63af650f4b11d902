"""One list of collective names: the calls the hook wraps, whose names it records as ops, are
the calls the coordinator recognises a waiting rank by (watchdog/collectives.py)."""

from __future__ import annotations

import types

import pytest

from watchdog import model
from watchdog.collectives import COLLECTIVES, DDP_INIT_OP, POINT_TO_POINT, SHARES_MODEL
from watchdog.coordinator.evidence import collective_frame
from watchdog.hook.patches.install import TorchPatches
from watchdog.hook.recorder import Recorder
from watchdog.model import Frame

RECORDED = (*COLLECTIVES, *POINT_TO_POINT)  # each recorded under its function's name


def stand_in_distributed() -> types.ModuleType:
    """torch.distributed as the hook sees it, with a function for each listed name, not yet
    initialised."""
    c10d = types.ModuleType("distributed_c10d")
    signatures = {name: "tensor, group=None, async_op=False" for name in COLLECTIVES}
    signatures.update({name: f"tensor, {peer}=None, group=None, tag=0, {group_peer}=None"
                       for name, (peer, group_peer, _) in POINT_TO_POINT.items()})
    for name in ("init_process_group", "new_group", "destroy_process_group"):
        signatures[name] = "*args, **kwargs"
    for name, parameters in signatures.items():
        exec(f"def {name}({parameters}): return None", c10d.__dict__)
    dist = types.ModuleType("torch.distributed")
    dist.__dict__.update(distributed_c10d=c10d, is_initialized=lambda: False)
    return dist


def test_the_hook_wraps_every_listed_collective_and_transfer() -> None:
    dist = stand_in_distributed()
    originals = {name: getattr(dist.distributed_c10d, name) for name in RECORDED}
    TorchPatches(Recorder()).patch_distributed(dist)
    for name in RECORDED:
        wrapper = getattr(dist.distributed_c10d, name)
        assert getattr(dist, name) is wrapper
        assert wrapper.__wrapped__ is originals[name]


@pytest.mark.parametrize("op", RECORDED)
def test_the_coordinator_recognises_a_rank_waiting_in_every_op_the_hook_records(op: str) -> None:
    waiting = Frame(op, "/job/train.py", 10)
    assert collective_frame((waiting, Frame("main", "/job/train.py", 20))) == waiting


def test_the_names_the_hook_records_for_ddp_are_the_coordinators() -> None:
    assert model.DDP_INIT_OP == DDP_INIT_OP
    assert "all_reduce" in COLLECTIVES  # DDP's gradient all-reduce
    assert set(COLLECTIVES) >= SHARES_MODEL
