"""What the hook does on a real GPU (a script for a machine with CUDA, not a test):
`python -m tests.bench.gpu_hook [--busy 6]`.

One rank (NCCL, a world of 1) trains a small DDP model on cuda:0 with the hook installed, its
silent-bug checks at their defaults (steps 8, 16, 32). Its loss is made NaN at step 30. At step
20 the training stream is kept busy for `--busy` seconds (`torch.cuda._sleep`), as a hung NCCL
kernel keeps it: the fingerprints of step 32 and the losses of steps 20 to 39 can only be read
back once it is free. Printed:
- the training thread's median step and its longest one: the hook never waits for the device,
  so the step that queued the busy kernel is no longer than the others;
- the longest gap between the beacon's heartbeats while the device was busy: the publisher
  thread, which reads losses and fingerprints back, never waits for it either (it publishes
  every 0.2 s);
- what the beacon says once the device is free: the first non-finite loss (step 30 expected)
  and the fingerprints taken;
- the SM utilisation the agent's NVML sampler saw for this process while the device was busy.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=os.environ.get("MASTER_PORT", "29517"),
                  WATCHDOG_BEACON_DIR=tempfile.mkdtemp(prefix="gpu-hook-"),
                  WATCHDOG_JOB_ID="gpu-hook")

import watchdog  # installed before torch.distributed is imported, as `run` does

watchdog.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from watchdog.beacon import beacon_path, open_beacon, read_beacon  # noqa: E402
from watchdog.env import beacon_dir, job_id  # noqa: E402

STEPS, NAN_STEP, BUSY_STEP = 40, 30, 20


def cycles_per_second() -> float:
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(100_000_000)
    torch.cuda.synchronize()
    return 100_000_000 / (time.perf_counter() - start)


class Heartbeats(threading.Thread):
    """The beacon's heartbeat as the agent reads it, every 20 ms: the gaps between its changes."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        path = beacon_path(os.path.join(beacon_dir(), str(os.geteuid())), job_id(), 0,
                           os.getpid())
        self.beacon = open_beacon(path)
        self.changes: list[float] = []  # when the heartbeat was seen to change (monotonic)
        self.stop = threading.Event()

    def run(self) -> None:
        last = read_beacon(self.beacon).heartbeat
        while not self.stop.wait(0.02):
            beat = read_beacon(self.beacon).heartbeat
            if beat != last:
                self.changes.append(time.monotonic())
                last = beat

    def longest_gap(self, start: float, end: float) -> float:
        seen = [start] + [t for t in self.changes if start <= t <= end] + [end]
        return max(b - a for a, b in itertools.pairwise(seen))


def gpu_utilization(seconds: float) -> str:
    try:
        from agent.gpu import GpuSampler
    except Exception as e:  # the agent's imports (gRPC) may be missing where only torch is
        return f"not measured ({e!r})"
    sampler = GpuSampler()
    if not sampler.available:
        return "NVML not available"
    sampler.utilization()
    time.sleep(seconds)
    return f"{sampler.utilization().get(os.getpid(), 0.0):.0f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=float, default=6.0, help="seconds the device stays busy")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_hook: no CUDA device here: nothing to measure")
        return 1
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda(),
        device_ids=[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rate = cycles_per_second()
    beats = Heartbeats()
    beats.start()
    step_times: list[float] = []
    free = torch.cuda.Event()
    busy_from = 0.0
    for step in range(STEPS):
        began = time.perf_counter()
        if step == BUSY_STEP:
            busy_from = time.monotonic()
            torch.cuda._sleep(int(args.busy * rate))
            free.record()
        x = torch.randn(64, 256, device="cuda")
        loss = model(x).pow(2).mean()
        if step == NAN_STEP:
            loss = loss * float("nan")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step_times.append(time.perf_counter() - began)
    utilization = gpu_utilization(min(1.0, args.busy / 3))
    while not free.query():
        time.sleep(0.01)
    busy_to = time.monotonic()
    torch.cuda.synchronize()
    time.sleep(1.0)  # the publisher's next rounds read what the device held back
    beats.stop.set()
    beats.join()
    snapshot = read_beacon(beats.beacon)
    checks = snapshot.checks
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"training thread: median step {statistics.median(step_times) * 1e3:.2f} ms, "
          f"longest {max(step_times) * 1e3:.2f} ms (step {step_times.index(max(step_times))}); "
          f"the device was busy {busy_to - busy_from:.2f} s from step {BUSY_STEP}")
    print(f"publisher: longest heartbeat gap while the device was busy "
          f"{beats.longest_gap(busy_from, busy_to):.2f} s")
    print(f"beacon: steps {snapshot.steps}, first non-finite loss at step "
          f"{checks.nonfinite_step} ({checks.nonfinite_value}), expected {NAN_STEP}; "
          f"fingerprints {[(f.of, f.step) for f in checks.fingerprints]}")
    print(f"NVML: this process used {utilization} of the SMs while the device was busy")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
