"""A DDP job whose whole training step is compiled (torch.compile, the eager backend: dynamo
alone); gloo on CPU. Each rank prints what its beacon counted once it is done:
"rank R counted S steps, F DDP forwards"."""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from watchdog.beacon import open_beacon, read_beacon
from watchdog.hook import lifecycle

DDP_INIT_COLLECTIVES = 2  # the parameter shape check and broadcast, on DDP's group


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="eager")
    def step(batch: torch.Tensor) -> torch.Tensor:
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    for _ in range(args.steps):
        step(torch.randn(4, 8))
    recorder = lifecycle._recorder
    assert recorder is not None and recorder.writer is not None, "run under the hook"
    recorder.publish()
    snap = read_beacon(open_beacon(recorder.writer.path))
    forwards = snap.groups[0].entered_seq - DDP_INIT_COLLECTIVES
    print(f"rank {dist.get_rank()} counted {snap.steps} steps, {forwards} DDP forwards",
          flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
