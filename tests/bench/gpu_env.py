"""The set-up findings and a GPU incident on a real GPU (a script for a machine with CUDA and one
GPU, not a test): `python -m tests.bench.gpu_env`. Three runs under the real CLI, each printed:

1. shared: 2 ranks of one torchrun job on the one GPU, neither calling torch.cuda.set_device
   (`model.cuda()` and `DDP(model)`, gloo for the collectives): a SHARED_DEVICE warning naming
   both ranks and GPU 0 is expected, and the job ends 0.
2. stuck: 2 ranks on the GPU; rank 1 queues a kernel that spins for minutes
   (`torch.cuda._sleep`) and waits for it in `torch.cuda.synchronize()`, while rank 0 waits in
   an all_reduce. The hang incident's per-rank `activity.gpu_util` (NVML, from the agent) is
   printed, with each rank's GPU memory as NVML sees it while it hangs.
3. `watchdog check --backend nccl --nproc 1`: its exit code (0 expected) and last lines.

docs/design.md keeps the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from watchdog.cli.demo import torchrun_command

TRAIN = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(64, 64).cuda())  # the seed's mistake: no set_device, no index
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(20):
        if sys.argv[1] == "stuck" and rank == 1 and step == 10:
            torch.cuda._sleep(1 << 40)  # minutes of spinning on the device
            torch.cuda.synchronize()
        opt.zero_grad()
        model(torch.randn(32, 64, device="cuda")).sum().backward()
        opt.step()
        time.sleep(0.05)
    dist.destroy_process_group()
""")
WATCHDOG = [sys.executable, "-m", "watchdog"]


def run(mode: str, work: Path, *options: str) -> tuple[int, str]:
    script = work / "train.py"
    script.write_text(TRAIN)
    env = {"WATCHDOG_DB": str(work / f"{mode}.db")}
    cmd = [*WATCHDOG, "run", *options, "--", *torchrun_command(2, mode, script=str(script))]
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    memory = ""
    if mode == "stuck":
        time.sleep(20)  # into the hang
        memory = gpu_memory()
    out, _ = proc.communicate(timeout=300)
    listed = subprocess.run([*WATCHDOG, "incidents", "list", "--json"], text=True,
                            env={**os.environ, **env}, capture_output=True)
    print(f"--- {mode}: exit {proc.returncode}; GPU memory during the hang: {memory or '-'}")
    for incident in json.loads(listed.stdout or "[]"):
        print(f"  {incident['kind']} ({incident['severity']}): {incident['summary']}")
        for row in incident.get("ranks", []):
            activity = row.get("activity") or {}
            print(f"    rank {row['rank']}: state {row['state']}, gpu_util "
                  f"{activity.get('gpu_util')}, main_cpu {activity.get('main_cpu')}")
    return proc.returncode, out


def gpu_memory() -> str:
    """Each process's GPU memory, as NVML sees it."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    return ", ".join(f"pid {p.pid}: {p.usedGpuMemory / 2**20:.0f} MiB" for p in procs)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gpu-env-") as tmp:
        work = Path(tmp)
        run("shared", work, "--on-hang", "kill")
        run("stuck", work, "--stall-timeout", "5", "--on-hang", "kill")
        started = time.monotonic()
        check = subprocess.run([*WATCHDOG, "check", "--backend", "nccl", "--nproc", "1"],
                               text=True, capture_output=True)
        print(f"--- check --backend nccl: exit {check.returncode} in "
              f"{time.monotonic() - started:.1f} s")
        print("\n".join((check.stdout + check.stderr).splitlines()[-8:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
