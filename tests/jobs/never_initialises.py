"""A torchrun worker that imports torch.distributed but never calls init_process_group: it
sleeps until the file named by its argument exists (or 180 s passed), then exits 0, as a script
that waits on something of its own before it initialises would."""

import os
import sys
import time

import torch.distributed  # noqa: F401  (what a training script imports first)

deadline = time.monotonic() + 180.0
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.1)
