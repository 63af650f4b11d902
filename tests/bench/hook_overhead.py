"""What the hook costs (a script, not a test): `python -m tests.bench.hook_overhead`.

(a) ns per recorded event: the recorder's enter+complete path, and a wrapped collective minus the
    same call unwrapped (a no-op stand-in, so no communication noise hides the difference); and
    what the publisher thread spends per round copying that into the beacon;
(b) step time of a small 2-rank gloo DDP job under torchrun, hooked vs unhooked: one run that
    installs or removes the hook's patches before each step, in a random order, so both see the
    same machine state; and, in the same run, hooked with the silent-bug checks held off, which
    gives what the checks add. (On two cores, blocks of 50 steps each way gave ratios from 0.97
    to 1.04 from run to run, and strict alternation was biased: even steps ran slower than odd
    ones.)
    Wall-clock time includes waiting for the peer; the main thread's CPU time, which the hook
    adds to, does not. Hooked steps run the checks as a user gets them (each one, at the default
    K, counted in hooked steps): they work only every K steps, so the mean per step says what
    they cost, and the median does not.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from watchdog.beacon import BeaconWriter, Identity
from watchdog.cli.demo import free_port
from watchdog.hook.checks import CHECK_EVERY
from watchdog.hook.lifecycle import PUBLISH_INTERVAL
from watchdog.hook.patches.c10d import wrap_collective
from watchdog.hook.patches.install import TorchPatches
from watchdog.hook.recorder import Recorder
from watchdog.supervise.inject import BOOT_DIR

REPO = Path(__file__).resolve().parents[2]

EVENTS = 1_000_000
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None
WARMUP_STEPS = 200
# Hidden width of the MLP -> steps each way, in a random order: a sub-millisecond step, where the
# hook's fixed cost per step shows most and many steps are cheap (they narrow the interval),
# and a few-millisecond one, still far shorter than a GPU training step.
STEPS = {64: 40_000, 512: 10_000}
BOOTSTRAP = 400
HOOKED, UNHOOKED, NO_CHECKS = "hooked", "unhooked", "hooked, checks held off"
MODES = (HOOKED, UNHOOKED, NO_CHECKS)


def per_call_ns(call: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e9


def event_costs() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        identity = Identity("bench", 0, 0, 2, "host", os.getpid(), time.time())
        recorder = Recorder(BeaconWriter(os.path.join(tmp, "b.beacon"), identity), identity)
        slot = recorder.writer.group_slot("0", (0, 1), 2)

        def enter_complete() -> None:
            recorder.complete(slot, recorder.enter(slot, b"all_reduce"))

        pair_ns = per_call_ns(enter_complete, EVENTS)
        print(f"(a) recorder enter+complete: {pair_ns:.0f} ns per pair = "
              f"{pair_ns / 2:.0f} ns per event")

        def all_reduce(tensor: object, op: object = None, group: object = None,
                       async_op: bool = False) -> None:
            return None

        patches = TorchPatches(recorder)
        patches.slots.cache[None] = slot  # as after init_process_group
        wrapped = wrap_collective(all_reduce, types.ModuleType("stand_in_c10d"), recorder,
                                  patches.slots, patches.works)
        bare_ns = min(per_call_ns(lambda: all_reduce(1), EVENTS) for _ in range(3))
        hooked_ns = min(per_call_ns(lambda: wrapped(1), EVENTS) for _ in range(3))
        print(f"(a) wrapped collective: {hooked_ns:.0f} ns vs {bare_ns:.0f} ns unwrapped: "
              f"+{hooked_ns - bare_ns:.0f} ns per collective (2 events)")

        for n_groups in (1, 4):
            for name in range(1, n_groups):
                recorder.writer.group_slot(str(name), (0, 1), 2)
            publish_ns = per_call_ns(recorder.publish, EVENTS // 10)
            print(f"(a) publisher thread, {n_groups} process group(s): {publish_ns / 1e3:.1f} us "
                  f"per round, every {PUBLISH_INTERVAL} s: "
                  f"{publish_ns / 1e9 / PUBLISH_INTERVAL:.4%} of one core")


def hook_switch(recorder: Recorder) -> Any:
    """Turns the hook's per-step work on or off: DDP's forward patch, Tensor.backward's (the
    losses kept for the nonfinite_loss check), the optimizer step's count and recording. Off, a
    step runs torch's own code only. With the checks held off, a due check waits for a step
    with them on: they come every K steps of those; no loss is kept."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    hooked_forward, hooked_backward = DistributedDataParallel.forward, torch.Tensor.backward
    optimizer_class = torch.optim.Optimizer
    hooked_step_code = optimizer_class._optimizer_step_code
    assert hasattr(hooked_step_code, "__wrapped__"), "expected the hook's step counter there"

    held = [recorder.check_at, recorder.checks.batch_due]  # while the checks are held off

    def switch(mode: str) -> None:
        on = mode != UNHOOKED
        recorder.enabled = on
        DistributedDataParallel.forward = (  # type: ignore[method-assign]
            hooked_forward if on else hooked_forward.__wrapped__)
        torch.Tensor.backward = (  # type: ignore[method-assign]
            hooked_backward if on else hooked_backward.__wrapped__)
        recorder.checks.losses.watching = mode == HOOKED
        optimizer_class._optimizer_step_code = (  # type: ignore[method-assign]
            hooked_step_code if on else hooked_step_code.__wrapped__)
        if recorder.check_at == sys.maxsize:  # the last step held them: one step later now
            recorder.check_at, recorder.checks.batch_due = held[0] + 1, bool(held[1])
        if mode == NO_CHECKS:
            held[:] = [recorder.check_at, recorder.checks.batch_due]
            recorder.check_at, recorder.checks.batch_due = sys.maxsize, False

    return switch


def ddp_worker(out: str, width: int) -> None:
    """One rank of the step-time job: the hook is on for a random half of the steps."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from watchdog.hook import lifecycle as _hook

    recorder = _hook._recorder
    assert recorder is not None and recorder.enabled, "run under the hook (see main)"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    batch = torch.randn(32, width)
    switch = hook_switch(recorder)

    def step() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
        return time.perf_counter() - wall, time.thread_time() - cpu

    for _ in range(WARMUP_STEPS):
        step()
    times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    modes = list(MODES) * STEPS[width]
    random.Random(0).shuffle(modes)  # same order on both ranks
    for mode in modes:
        switch(mode)
        times[mode].append(step())
    switch(HOOKED)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def report(label: str, hooked: list[float], unhooked: list[float]) -> None:
    """Ratio of medians with a 90% bootstrap interval, and the same ratio between two random
    halves of the unhooked steps: the noise floor of this machine; and the means, with a 90%
    interval for their difference from the steps' variance (a few slow steps move a mean far
    more than a median: say how far)."""
    rng = random.Random(1)
    halves = rng.sample(unhooked, len(unhooked))
    noise = statistics.median(halves[::2]) / statistics.median(halves[1::2])
    on, off = statistics.median(hooked), statistics.median(unhooked)
    resampled = sorted(statistics.median(rng.choices(hooked, k=len(hooked)))
                       / statistics.median(rng.choices(unhooked, k=len(unhooked)))
                       for _ in range(BOOTSTRAP))
    low, high = resampled[BOOTSTRAP // 20], resampled[-BOOTSTRAP // 20]
    mean_on, mean_off = statistics.fmean(hooked), statistics.fmean(unhooked)
    more = (mean_on - mean_off) * 1e6
    spread = 1.645 * math.sqrt(statistics.variance(hooked) / len(hooked)
                               + statistics.variance(unhooked) / len(unhooked))
    print(f"  {label}: median {on * 1e3:.3f} ms vs {off * 1e3:.3f} ms "
          f"({(on - off) * 1e6:+.1f} us), ratio {on / off:.4f} (90% interval {low:.4f}-"
          f"{high:.4f}; noise floor: unhooked vs unhooked {noise:.4f}); mean "
          f"{mean_on * 1e3:.3f} vs {mean_off * 1e3:.3f} ms ({more:+.1f} us, 90% interval "
          f"{more - spread * 1e6:+.1f} to {more + spread * 1e6:+.1f} us)")


def step_costs(width: int) -> None:
    # Beacons where they live in production: tmpfs, whose pages never go back to a disk.
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=SHM) as shm:
        out = os.path.join(tmp, "times.json")
        env = dict(os.environ, WATCHDOG_AUTOINSTALL="1", WATCHDOG_BEACON_DIR=shm,
                   PYTHONPATH=f"{BOOT_DIR}:{REPO}")
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                              f"--master_port={free_port()}", __file__, "--ddp-worker", out,
                              str(width)], env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"the step-time job failed ({run.returncode}):\n{run.stderr[-3000:]}")
        times = json.loads(Path(out).read_text())
    print(f"(b) DDP step of rank 0, 2 ranks gloo, MLP {width} wide, {STEPS[width]} steps each "
          f"way in a random order; the checks every {CHECK_EVERY} steps. A step: zero_grad, "
          f"DDP forward of a batch of 32, backward (DDP all-reduces the gradients over gloo), "
          f"SGD step")
    for on, off in ((HOOKED, UNHOOKED), (NO_CHECKS, UNHOOKED), (HOOKED, NO_CHECKS)):
        print(f"(b) {on} vs {off}:")
        for column, label in enumerate(("wall-clock step time", "main-thread CPU time per step")):
            report(label, *([t[column] for t in times[m]] for m in (on, off)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ddp-worker"]:
        ddp_worker(sys.argv[2], int(sys.argv[3]))
    else:
        event_costs()
        for width in STEPS:
            step_costs(width)
