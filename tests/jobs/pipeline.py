"""A 4-stage pipeline on CPU (gloo), as pipeline parallelism passes activations: each rank
receives from the rank before it (irecv), runs its stage and an optimizer step, and sends to the
rank after it (isend). At step FAULT_STEP, rank FAULT_RANK blocks loading a shard right after
its input arrived: its neighbours wait in transfers, in no collective, and only the end of its
irecv's wait() tells that rank 1 is not waiting too.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

FAULT_STEP, FAULT_RANK = 4, 1


def load_shard() -> None:
    time.sleep(3600)  # the storage read that never returns


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stage = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    for step in range(1000):
        x = torch.randn(4, 8)
        if rank > 0:
            dist.irecv(x, src=rank - 1).wait()
        if step == FAULT_STEP and rank == FAULT_RANK:
            load_shard()
        y = stage(x)
        optimizer.zero_grad()
        y.sum().backward()
        optimizer.step()
        if rank < world - 1:
            dist.isend(y.detach(), dst=rank + 1).wait()
        time.sleep(0.05)


if __name__ == "__main__":
    main()
