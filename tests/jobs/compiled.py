"""A torch.compile'd DDP job (inductor on CPU, gloo) as a modern training script is: its first
step compiles the model, an evaluation pass compiles it again (inference, no backward), and the
last batches of an epoch come short, a new shape (the model is compiled with static shapes, so
that is a whole new compile, forward and its backward). With cold caches (a fresh TMPDIR and
TORCHINDUCTOR_CACHE_DIR, as on a fresh node), each compile builds what it needs from scratch;
the ranks queue on inductor's cache lock while one runs the C++ compiler.

`--fault-rank R --fault-step S`: rank R blocks reading its batch at step S, for ever.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

BATCH, SHORT_BATCH, WIDTH = 8, 5, 32


def build(blocks: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.LayerNorm(WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1))


def read_batch(step: int, size: int, stall: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands for a data pipeline; `stall`: a read from a network filesystem that never
    returns."""
    if stall:
        print(f"fault data_stall at step {step}, time {time.time():.3f}", file=sys.stderr,
              flush=True)
        time.sleep(3600)
    return torch.randn(size, WIDTH), torch.randn(size, 1)


def evaluate(model: torch.nn.Module) -> None:
    model.eval()
    with torch.no_grad():
        model(torch.randn(BATCH, WIDTH)).softmax(0).sum().item()
    model.train()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--evaluate-at", type=int, default=8)
    parser.add_argument("--short-from", type=int, default=16, help="batches come short from")
    parser.add_argument("--fault-rank", type=int, default=-1)
    parser.add_argument("--fault-step", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # every replica starts alike; DDP broadcasts rank 0's anyway
    model = DistributedDataParallel(torch.compile(build(args.blocks), dynamic=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(rank)  # each rank its own data
    began = time.monotonic()
    for step in range(args.steps):
        if step == args.evaluate_at:
            evaluate(model)
        size = SHORT_BATCH if step >= args.short_from else BATCH
        x, y = read_batch(step, size, rank == args.fault_rank and step == args.fault_step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and time.monotonic() - began > 1.0:  # a compile: how long it took here
            print(f"step {step} took {time.monotonic() - began:.1f} s", flush=True)
        time.sleep(0.05)
        began = time.monotonic()
    dist.destroy_process_group()
    if rank == 0:
        print(f"finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
