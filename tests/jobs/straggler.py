"""A 4-rank job (gloo, CPU) with one slow rank, or jitter on every rank, or rank 0's periodic
extra work: the straggler tests' job. Every step reads a batch (read_shard) and computes; the
slow rank spends --slow-s more per step in its data or its compute, spell after spell
(--spells), catching up in a spell of none and after the last. Its gradients are synchronised
by DDP, by FSDP2 (`fully_shard`), or by hand (an all_reduce of each gradient): --sync. Under
torchrun, or started by `torch.multiprocessing.spawn` (--spawn N: N processes, each told its
rank by init_process_group's arguments, none in its environment)."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from spawn_job import free_port  # a job beside this one (this script's directory)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
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


def _model(sync: str) -> torch.nn.Module:
    layer = torch.nn.Linear(8, 1)
    if sync == "ddp":
        return DistributedDataParallel(layer)
    if sync == "fsdp2":
        fully_shard(layer, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    return layer


def _average_by_hand(model: torch.nn.Module) -> None:
    for parameter in model.parameters():
        assert parameter.grad is not None
        dist.all_reduce(parameter.grad)
        parameter.grad /= dist.get_world_size()


def _spawned(rank: int, world: int, argv: list[str]) -> None:
    main(argv, rank, world)


def _spells(text: str) -> list[tuple[str, float]]:
    """'data:30,none:20,compute:30' -> [("data", 30.0), ...]: the slow rank's spells, in turn."""
    pairs = (spell.split(":") for spell in text.split(",") if spell)
    return [(kind, float(seconds)) for kind, seconds in pairs]


def _spell(spells: list[tuple[str, float]], elapsed: float) -> str:
    for kind, seconds in spells:
        if elapsed < seconds:
            return kind
        elapsed -= seconds
    return "none"


def main(argv: list[str], rank: int = -1, world: int = -1) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=40.0, help="rank 0 stops the job then")
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-s", type=float, default=0.4)
    parser.add_argument("--spells", type=_spells, default=[("data", 3600.0)],
                        help="the slow rank's spells, KIND:SECONDS,...: data, compute, none")
    parser.add_argument("--jitter", type=float, default=0.0, help="every rank: up to S more")
    parser.add_argument("--rank0-work", default="", metavar="S:STEPS,...",
                        help="rank 0 works S more every STEPS steps")
    parser.add_argument("--sync", choices=("ddp", "fsdp2", "by-hand"), default="ddp")
    parser.add_argument("--spawn", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    if args.spawn and rank < 0:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        mp.spawn(_spawned, (args.spawn, argv), nprocs=args.spawn)
        return 0
    periodic = [(float(s), int(every)) for s, every in
                (work.split(":") for work in args.rank0_work.split(",") if work)]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rank = dist.get_rank()
    rng = random.Random(rank)
    model = _model(args.sync)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stop = torch.zeros(1)
    began = time.monotonic()
    step = 0
    while not stop.item():
        spell = _spell(args.spells, time.monotonic() - began) if rank == args.slow_rank else ""
        extra = rng.uniform(0, args.jitter) + (
            sum(s for s, every in periodic if step % every == 0) if rank == 0 else 0.0)
        x = read_shard(extra + (args.slow_s if spell == "data" else 0.0))
        if spell == "compute":
            crunch(args.slow_s)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        if args.sync == "by-hand":
            _average_by_hand(model)
        optimizer.step()
        step += 1
        if step % 50 == 0:  # rank 0 says when to stop, so every rank takes the same steps
            stop.fill_(float(rank == 0 and time.monotonic() - began > args.seconds))
            dist.all_reduce(stop)
    dist.destroy_process_group()
    if rank == 0:
        print(f"finished {step} steps in {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
