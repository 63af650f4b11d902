"""A user's exception through a patched torch call (loss.backward(), DDP's forward, a
collective, a send, Work.wait) carries no frame of the hook's wrappers: users read tracebacks
to find whom to blame (issue 41); and what DDP's forward records. Real torch calls in a
one-rank gloo group."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.helpers.recorders import ddp_linear, one_rank, recorder
from watchdog.frames import HOOK_DIR
from watchdog.hook.patches.backward import wrap_backward
from watchdog.hook.patches.c10d import wrap_collective, wrap_p2p
from watchdog.hook.patches.ddp import wrap_forward
from watchdog.hook.patches.install import TorchPatches
from watchdog.hook.patches.works import patch_work_wait

__all__ = ["one_rank"]  # the fixture, used by name
C10D = "torch.distributed.distributed_c10d"


def raised_through(call: Callable[[], Any]) -> str:
    with pytest.raises(Exception) as caught:
        call()
    return "".join(traceback.format_exception(caught.value))


def test_no_hook_frame_in_a_traceback_through_a_wrapped_call(one_rank: None,
                                                             tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    patches = TorchPatches(rec)
    patches.slots.attach(dist)
    c10d = sys.modules[C10D]
    all_reduce = wrap_collective(dist.all_reduce, c10d, rec, patches.slots, patches.works)
    send = wrap_p2p(dist.send, c10d, rec, patches.slots, patches.works, ("dst", "group_dst",
                                                                          False))
    backward = wrap_backward(torch.Tensor.backward, rec)
    forward = wrap_forward(DistributedDataParallel.forward, rec, patches.slots)

    class Work:
        def wait(self) -> None:
            raise RuntimeError("Connection closed by peer")

    assert patch_work_wait(Work, rec, patches.works) is not None
    shown = {
        "backward": raised_through(lambda: backward(torch.ones(1))),  # needs no grad
        "collective": raised_through(lambda: all_reduce([1.0])),  # not a tensor
        "send": raised_through(lambda: send(torch.ones(1), 0)),  # to itself
        "forward": raised_through(lambda: forward(ddp_linear(), torch.ones(2, 3))),  # 8 wide
        "wait": raised_through(Work().wait),
    }
    for name, text in shown.items():
        assert HOOK_DIR not in text, f"{name}:\n{text}"
        assert __file__ in text, f"{name}:\n{text}"  # the caller's own frame stays


def test_ddp_forwards_enter_their_groups_all_reduce_found_by_identity(one_rank: None,
                                                                      tmp_path: Path) -> None:
    """Each training forward enters its group's all-reduce, pending, completed by the next
    event; a DDP module on another group has that group's slot looked up anew."""
    rec = recorder(tmp_path)
    patches = TorchPatches(rec)
    patches.slots.attach(dist)
    forward = wrap_forward(DistributedDataParallel.forward, rec, patches.slots)
    world, batch = ddp_linear(), torch.ones(2, 8)

    def seqs(slot: int) -> tuple[int, int]:  # (entered, completed)
        entered, completed = rec.progress()
        return entered[slot][0], completed.get(slot, 0)

    forward(world, batch)
    forward(world, batch)
    slot = rec.ddp_slot
    assert slot >= 0 and rec.ddp_group is world.process_group
    assert rec.ddp_calls == 2 and seqs(slot) == (2, 1)
    other = DistributedDataParallel(torch.nn.Linear(8, 4), process_group=dist.new_group([0]))
    forward(other, batch)
    assert rec.ddp_group is other.process_group and rec.ddp_slot not in (-1, slot)
    assert seqs(slot) == (2, 2)  # the next event completed the first group's
