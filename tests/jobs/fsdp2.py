"""A small FSDP2 (`fully_shard`) training job on CPU (gloo): each Linear layer sharded, then the
root. Its collectives (all_gather_single, reduce_scatter_single) are issued from FSDP's Python
hooks. With --fault-rank R --fault-step N, rank R blocks in its data loading before step N.
With --hsdp the mesh has a replicate dimension of 2 (HSDP): the shards of one index are
replicas, whose gradients FSDP all-reduces across the replicate group. Each rank initialises
its model from a seed of its own (FSDP2 broadcasts nothing): 1-D shards differ by design, HSDP
replicas must not, unless --seed-alike.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def read_sample_from_storage(step: int) -> None:
    """Stands for a read from a network filesystem that never returns."""
    print(f"fault data_stall at step {step}, time {time.time():.3f}", file=sys.stderr, flush=True)
    time.sleep(3600)


def sharded_model(world: int, hsdp: bool) -> torch.nn.Module:
    mesh = (init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
            if hsdp else init_device_mesh("cpu", (world,)))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fault-rank", type=int, default=-1)
    parser.add_argument("--fault-step", type=int, default=6)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--hsdp", action="store_true")
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = sharded_model(world, args.hsdp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if step == args.fault_step and rank == args.fault_rank:
            read_sample_from_storage(step)
        x, y = torch.randn(4, 8), torch.ones(4, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.05)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
