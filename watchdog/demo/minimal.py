"""The seed's minimal reproduction, which `watchdog check` runs under torchrun: each rank joins
the job, all-reduces one tensor, waits at a barrier and leaves, and times each step.

Each rank prints one line per step it finished or failed, for `watchdog check` to read back:
`watchdog-check {"rank": 0, "step": "all_reduce", "seconds": 0.002, "error": ""}`. A step that
fails raises on after its line, so the watchdog sees the rank exit with that exception.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from watchdog.demo import MINIMAL_PREFIX


def timed(rank: int, step: str, body: Callable[[], object]) -> None:
    started = time.monotonic()
    error = ""
    try:
        body()
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        line = {"rank": rank, "step": step, "seconds": round(time.monotonic() - started, 4),
                "error": error}
        # one write: the ranks share the file torchrun's output goes to
        sys.stdout.write(f"{MINIMAL_PREFIX}{json.dumps(line)}\n")
        sys.stdout.flush()


def all_reduce(tensor: torch.Tensor, world: int) -> None:
    dist.all_reduce(tensor)
    if tensor.item() != world:
        raise RuntimeError(f"all_reduce summed to {tensor.item()}, expected {world}: the ranks "
                           "did not all take part")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    backend = parser.parse_args(argv).backend
    rank = int(os.environ["RANK"])
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    timed(rank, "init_process_group", lambda: dist.init_process_group(backend))
    tensor = torch.ones(1, device=device)
    timed(rank, "all_reduce", lambda: all_reduce(tensor, dist.get_world_size()))
    timed(rank, "barrier", dist.barrier)
    timed(rank, "destroy_process_group", dist.destroy_process_group)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
