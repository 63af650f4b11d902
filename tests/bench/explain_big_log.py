"""Benchmark: `watchdog explain` over a ~1 GB synthetic log, to show speed and constant memory.

Run from the repository root: `python -m tests.bench.explain_big_log [--gb 1.0]`.
The log mixes NCCL INFO lines, training progress and torchrun warnings with a few errors in
every block; it is written by repeating one pre-built block and deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from watchdog.explain.scan import explain_main

BLOCK_LINES = 10_000


def block() -> str:
    """About 1 MB of lines: 60% NCCL INFO, 39% training output, and 3 errors."""
    lines = []
    for n in range(BLOCK_LINES):
        if n % 5 < 3:
            peer = (n + 1) % 8
            lines.append(f"gpu-node-{n % 16}:{4000 + n % 8}:{4100 + n % 64} [{n % 8}] NCCL INFO "
                         f"Channel {n % 32:02d}/0 : {n % 8}[{n % 8}] -> {peer}[{peer}] via P2P/IPC")
        elif n % 97 == 0:
            lines.append(f"W1202 13:07:{n % 60:02d}.482000 7640 torch/distributed/run.py:874] "
                         "Setting OMP_NUM_THREADS environment variable for each process to be 1")
        else:
            lines.append(f"[rank{n % 8}] epoch 3 step {n} loss {1 / (n + 1):.5f} lr 3.0e-04 "
                         f"grad_norm 0.{n % 1000:03d} tokens/s 182734.5")
    lines[5000] = ("gpu-node-3:4003:4103 [3] misc/socket.cc:50 NCCL WARN socketProgress: "
                   "Connection closed by remote peer gpu-node-5<42107>")
    lines[7000] = ("[rank3]:[E1202 13:07:10.1 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught "
                   "collective operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE) ran for "
                   "600026 milliseconds before timing out.")
    lines[9000] = "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB."
    return "\n".join(lines) + "\n"


def write_log(path: Path, gigabytes: float) -> int:
    """Writes the log; returns its number of lines."""
    text = block().encode()
    copies = max(1, round(gigabytes * 1024**3 / len(text)))
    with path.open("wb") as stream:
        for _ in range(copies):
            stream.write(text)
    return copies * BLOCK_LINES


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=1.0, help="size of the log in GiB")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="explain-bench-") as folder:
        log = Path(folder) / "big.log"
        started = time.perf_counter()
        lines = write_log(log, args.gb)
        size = log.stat().st_size
        print(f"wrote {size / 1024**2:.0f} MiB, {lines} lines in "
              f"{time.perf_counter() - started:.1f} s; peak RSS before: {peak_rss_mib():.1f} MiB")
        started = time.perf_counter()
        with open(os.devnull, "w") as sink:
            status = explain_main([str(log)], True, sink, sys.stdin)
        elapsed = time.perf_counter() - started
    print(f"explain: {elapsed:.1f} s, {lines / elapsed:,.0f} lines/s, "
          f"{size / 1024**2 / elapsed:.0f} MiB/s; peak RSS after: {peak_rss_mib():.1f} MiB")
    return status


if __name__ == "__main__":
    sys.exit(main())
