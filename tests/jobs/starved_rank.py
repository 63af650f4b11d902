"""Two ranks. After 3 steps rank 1 is starved: its main thread drops to SCHED_IDLE on core 0
beside a busy loop it starts there (another process at normal priority, in its session so that
the scheduler weighs the two against each other), and computes for STARVED_S while rank 0 waits
in the next all_reduce. Then it ends the busy loop and the job finishes. The busy loop's pid
goes to argv[1] (for the test to end it should the rank die first); it also ends itself."""

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import watchdog

STARVED_S = 15.0
HOG = ("import os, time\n"
       "os.sched_setaffinity(0, {0})\n"
       "end = time.monotonic() + 90\n"
       "while time.monotonic() < end:\n"
       "    pass\n")

dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(1))
    watchdog.step()
if dist.get_rank() == 1:
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    with open(sys.argv[1], "w") as f:
        f.write(str(hog.pid))
    os.sched_setaffinity(0, {0})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    print(f"rank 1 starved from {time.time():.3f}", flush=True)
    end = time.monotonic() + STARVED_S
    while time.monotonic() < end:
        pass  # work it does only when the core has nothing better to do
    hog.kill()
    hog.wait()
dist.all_reduce(torch.ones(1))
watchdog.step()
dist.destroy_process_group()
