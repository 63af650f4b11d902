"""What the silent-bug checks cost (a script, not a test): `python -m tests.bench.checks_overhead`.

In this process, on a DDP module in a one-rank gloo group, through the hook's own Checks:
(a) the main-thread work of one check on the MLP of hook_overhead.py (fingerprint of the
    parameters, their device and dtype checked) and of the next batch's fingerprint, amortized
    over the steps between checks at the default K; and the publisher's digest of them;
(b) the same on a 100M-parameter model on the CPU, and what that implies for 1B parameters
    (the fingerprint reads each parameter once: its cost grows with the bytes), amortized over
    K steps. The end-to-end per-step figure, checks on at the default K, is hook_overhead.py's
    mean main-thread CPU time per step.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from watchdog.beacon import CHECK_NAMES
from watchdog.hook.checks import CHECK_EVERY, Checks

BIG_LAYERS = 6  # Linear(4096, 4096) each: 100.7M parameters in all
RUNS = {"small": 2000, "big": 5}


def checks_on(ddp: DistributedDataParallel) -> Checks:
    checks = Checks(frozenset(CHECK_NAMES), CHECK_EVERY, lambda: 0)
    checks.torch = torch
    checks.wrapped(ddp)
    return checks


def timed(call: Any, runs: int) -> float:
    """Median seconds of main-thread CPU per call."""
    times = []
    for _ in range(runs):
        start = time.thread_time()
        call()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def check_costs(label: str, model: torch.nn.Module, batch: torch.Tensor, runs: int) -> None:
    ddp = DistributedDataParallel(model)
    checks = checks_on(ddp)
    n_params = sum(p.numel() for p in ddp.parameters())

    def check_and_batch() -> None:
        checks.due(8)
        checks.batch(ddp, (batch,), {})

    main = timed(check_and_batch, runs)
    digest = timed(lambda: checks.collect(8, 0), runs)  # each run digests the two just taken
    print(f"({label}) {n_params / 1e6:.1f}M parameters: a check and its batch take {main * 1e3:.3f}"
          f" ms of main-thread CPU, {main / CHECK_EVERY * 1e6:.2f} us per step amortized over "
          f"K={CHECK_EVERY} steps; the publisher digests them in {digest * 1e6:.0f} us")
    if n_params > 50e6:
        per_billion = main * 1e9 / n_params
        print(f"({label}) for 1B parameters: about {per_billion:.2f} s per check on this CPU "
              f"({torch.get_num_threads()} threads), {per_billion / CHECK_EVERY * 1e3:.1f} ms "
              f"per step amortized over K={CHECK_EVERY}; float32 read at "
              f"{n_params * 4 / main / 1e9:.1f} GB/s")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}",
                               rank=0, world_size=1)
        try:
            width = 64  # hook_overhead.py's sub-millisecond step
            check_costs("a", torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                                 torch.nn.Linear(width, 1)),
                        torch.randn(32, width), RUNS["small"])
            big = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096) for _ in range(BIG_LAYERS)))
            check_costs("b", big, torch.randn(8, 4096), RUNS["big"])
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
