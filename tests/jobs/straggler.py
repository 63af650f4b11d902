"""A 4-rank DDP job (gloo, CPU) with one slow rank, or jitter on every rank, or rank 0's
periodic extra work: the straggler tests' job. Every step reads a batch (read_shard) and
computes; the slow rank spends --slow-s more per step in its data or its compute, for
--slow-for seconds (then catches up)."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

READ_S = 0.05  # every rank's own read per step


def read_shard(extra: float) -> torch.Tensor:
    """A batch, as slow as a shard to decode."""
    time.sleep(READ_S + extra)
    return torch.randn(16, 8)


def crunch(seconds: float) -> None:
    """Compute on the CPU for `seconds`."""
    end = time.monotonic() + seconds
    a = torch.randn(64, 64)
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-s", type=float, default=0.4)
    parser.add_argument("--slow-in", choices=("data", "compute"), default="data")
    parser.add_argument("--slow-for", type=float, default=3600.0, metavar="S")
    parser.add_argument("--jitter", type=float, default=0.0, help="every rank: up to S more")
    parser.add_argument("--rank0-every", type=int, default=0, metavar="STEPS",
                        help="rank 0 works --slow-s more every STEPS steps")
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rng = random.Random(rank)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    began = time.monotonic()
    for step in range(args.steps):
        slow = rank == args.slow_rank and time.monotonic() - began < args.slow_for
        periodic = rank == 0 and args.rank0_every and step % args.rank0_every == 0
        extra = rng.uniform(0, args.jitter) + (args.slow_s if periodic else 0.0)
        x = read_shard(extra + (args.slow_s if slow and args.slow_in == "data" else 0.0))
        if slow and args.slow_in == "compute":
            crunch(args.slow_s)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
    if rank == 0:
        print(f"finished {args.steps} steps in {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
