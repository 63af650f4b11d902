"""Rank 3 finishes (exit 0) before it joins the job: ranks 0-2 wait for it in
init_process_group (30 min, gloo's timeout), and torchrun waits for every worker. On gloo a rank
that exits after joining leaves no one waiting: its sockets close, and its peers raise
("Connection closed by peer") within a second, as under the demo's --fault early_exit."""

import os
import sys
import time

import torch.distributed as dist

if os.environ["RANK"] == "3":
    print(f"fault early_exit at step 0, time {time.time():.3f}", file=sys.stderr, flush=True)
    sys.exit(0)
dist.init_process_group("gloo")
