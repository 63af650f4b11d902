"""A 2-rank CPU job that exercises everything the hook records; tests/unit/test_hook.py runs it
under torchrun with the hook auto-installed and checks the beacons it leaves.

Each rank writes what it saw from the inside to $PROBE_OUT/rank<N>.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import watchdog
from watchdog.beacon import BeaconGroup, beacon_path, open_beacon, read_beacon
from watchdog.env import beacon_dir, job_id

STEPS = 3


class Rows(Dataset[torch.Tensor]):
    """Its workers are forked from the rank: what they record must never reach its beacon.
    A row is 1.0 where the rank's beacon showed the phase only a worker declares."""

    def __len__(self) -> int:
        return 2 * STEPS

    def __getitem__(self, index: int) -> torch.Tensor:
        watchdog.step()
        with watchdog.phase("in-a-worker"):
            written = phase_of(os.getppid()) == "in-a-worker"
        return torch.full((4,), float(written))


def phase_of(pid: int) -> str:
    path = beacon_path(own_beacon_dir(), job_id(), int(os.environ["RANK"]), pid)
    return read_beacon(open_beacon(path)).phase


def own_beacon_dir() -> str:
    """This user's subdirectory of the beacon directory, where the hook writes."""
    return os.path.join(beacon_dir(), str(os.geteuid()))


def own_phase() -> str:
    return phase_of(os.getpid())


def own_groups() -> list[BeaconGroup]:
    """This rank's groups, as the agent would read them now."""
    assert watchdog.hook.lifecycle._recorder is not None
    watchdog.hook.lifecycle._recorder.publish()
    path = beacon_path(own_beacon_dir(), job_id(), int(os.environ["RANK"]), os.getpid())
    return list(read_beacon(open_beacon(path)).groups)


def own_pair_progress() -> list[int]:
    """This rank's (entered, completed) seqs with its peer."""
    (pair,) = [g for g in own_groups() if ":p2p:" in g.name]
    return [pair.entered_seq, pair.completed_seq]


def own_world_progress() -> list[Any]:
    """This rank's last collective on the world group: [op, entered seq, completed seq]."""
    world = own_groups()[0]
    return [world.op, world.entered_seq, world.completed_seq]


def error_of(call: Any, *args: Any) -> list[str]:
    try:
        call(*args)
    except Exception as e:
        return [type(e).__name__, str(e)]
    return []


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    after_ddp = own_world_progress()  # its shape check and broadcast, each entered and done
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Rows(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    worker_writes = 0
    for batch in loader:
        worker_writes += int(batch.sum().item())
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
    with torch.no_grad():
        model(torch.zeros(1, 4))  # no gradient all-reduce follows: not a collective
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    objects: list[Any] = [{"from": 0}]
    dist.broadcast_object_list(objects, src=0)
    solo = dist.new_group([0])
    if rank == 0:
        dist.all_reduce(tensor, group=solo)
        dist.send(tensor, dst=1)
    else:
        dist.recv(tensor)  # from any source
    # async transfers, alone and batched: each counts on the pair's slot and ends at its wait
    peer = 1 - rank
    (dist.isend(tensor, dst=peer) if rank == 0 else dist.irecv(tensor, src=peer)).wait()
    after_wait = own_pair_progress()  # the wait itself, with no event since, completed it
    batch = [dist.P2POp(dist.isend, tensor, peer), dist.P2POp(dist.irecv, torch.zeros(1), peer)]
    for work in dist.batch_isend_irecv(batch if rank == 0 else batch[::-1]):
        work.wait()
    errors = {
        "hooked": error_of(dist.all_reduce, "not a tensor"),
        "unhooked": error_of(dist.all_reduce.__wrapped__, "not a tensor"),
    }
    dist.all_reduce(tensor, async_op=True).wait()
    with watchdog.phase("checkpoint", timeout=60):
        outer = own_phase()
        with watchdog.phase("upload"):
            inner = own_phase()
        restored = own_phase()
        dist.barrier()
    child = subprocess.run([sys.executable, "-c", "import watchdog; print(watchdog.install())"],
                           capture_output=True, text=True, check=True)
    with open(os.path.join(os.environ["PROBE_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"phases": [outer, inner, restored, own_phase()], "errors": errors,
                   "child_install": child.stdout.strip(), "p2p_after_wait": after_wait,
                   "after_ddp": after_ddp,
                   "worker_writes": worker_writes}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
