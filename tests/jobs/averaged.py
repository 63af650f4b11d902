"""A training job that averages its gradients by hand, the tutorial way (an all_reduce of each
parameter's .grad, divided by the world size), with no DDP; gloo on CPU. --mode:
  desync     each rank seeds its model with its own rank: the replicas never agree;
  alike      every rank seeds its model alike: the replicas stay equal;
  local_sgd  no gradient is averaged: the parameters themselves are, every 50 steps from the
             first (local SGD), so the replicas differ between averages by design;
  nan        seeded alike; rank --nan-rank's loss is made NaN at step --nan-step.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

MODES = ("desync", "alike", "local_sgd", "nan")
LOCAL_SGD_PERIOD = 50


def average(tensors: list[torch.Tensor], world: int) -> None:
    for t in tensors:
        dist.all_reduce(t)
        t /= world


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nan-rank", type=int, default=1)
    parser.add_argument("--nan-step", type=int, default=30)
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank if args.mode == "desync" else 0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)  # each rank its own batches
    for step in range(args.steps):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.mode == "nan" and (rank, step) == (args.nan_rank, args.nan_step):
            loss = loss * float("nan")
        optimizer.zero_grad()
        loss.backward()
        if args.mode != "local_sgd":
            average([p.grad for p in model.parameters() if p.grad is not None], world)
        optimizer.step()
        if args.mode == "local_sgd" and step % LOCAL_SGD_PERIOD == 0:
            with torch.no_grad():
                average([p.data for p in model.parameters()], world)
        time.sleep(0.01)
    dist.destroy_process_group()
    if rank == 0:
        print(f"finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
