"""`watchdog demo`: a 4-rank CPU job whose rank 2 hangs in its data pipeline, diagnosed live
by `watchdog run`."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from watchdog.atomic import private_file
from watchdog.cli import options
from watchdog.demo import TRAIN_SCRIPT
from watchdog.errors import ExitCode, WatchdogError
from watchdog.report.terminal import use_color

if TYPE_CHECKING:
    from watchdog.coordinator.database import Database

DEMO_STALL_TIMEOUT_S = 5.0
FAULT_STEP = 6  # the loop's index, from 0, at which rank 2's next read blocks


class DemoCommand:
    name = "demo"
    help = "a 4-rank CPU job with an injected hang, diagnosed live"
    description = ("Runs a bundled 4-rank CPU job (gloo) whose rank 2 blocks in its data pipeline, "
                   "under `watchdog run`, and shows the diagnosis (about 15 s).")
    example = "watchdog demo"
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        options.add_db_option(p)

    def run(self, args: argparse.Namespace) -> int:
        from watchdog.coordinator.database import database_of

        return run_demo(database_of(args.db), use_color(sys.stderr))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_command(nproc: int, *train_args: str, launcher: Sequence[str] = (),
                     script: str = TRAIN_SCRIPT) -> list[str]:
    """torchrun on this interpreter (with `launcher` options), running `script`: by default the
    bundled training script."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            f"--master_port={free_port()}", *launcher, script, *train_args]


def run_demo(database: Database, color: bool) -> int:
    from watchdog.coordinator import StallPolicy
    from watchdog.supervise.embedded import RunOptions, run_job

    if importlib.util.find_spec("torch") is None:
        raise WatchdogError("the demo needs torch in this environment",
                            hint="pip install 'torch-hang-watchdog[test]' (or any torch build)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    fault = ("--fault", "data_stall", "--fault-rank", "2", "--fault-step", str(FAULT_STEP))
    cmd = torchrun_command(4, *fault)
    # The loader fetches a step's batch once the step before it is done: the read that blocks
    # is the batch of step FAULT_STEP + 1, after that many steps (the table's STEP column).
    print(f"watchdog demo: 4 ranks train a small DDP model on CPU (gloo); after {FAULT_STEP + 1} "
          "steps rank 2 blocks reading a sample.\nwatchdog run watches it and names the rank "
          f"within {DEMO_STALL_TIMEOUT_S:.0f}s of the last progress.\n$ watchdog run "
          f"--stall-timeout {DEMO_STALL_TIMEOUT_S:.0f} --on-hang kill -- torchrun "
          f"--nproc_per_node=4 train.py {' '.join(fault)}\n", flush=True)
    # The job's own output (torchrun's shutdown traceback among it) would bury the diagnosis.
    job_log = private_file("watchdog-demo-", "job.log")
    run_options = RunOptions(cmd, StallPolicy(fixed=DEMO_STALL_TIMEOUT_S), on_hang="kill",
                             database=database, color=color, job_log=job_log)
    code = asyncio.run(run_job(run_options, out=sys.stdout))
    if code != ExitCode.HANG_KILLED:
        print(f"watchdog demo: the job ended with exit code {code} before a diagnosis; the end "
              f"of its output ({job_log}):")
        print("".join(Path(job_log).read_text(errors="replace").splitlines(True)[-20:]))
        return ExitCode.ERROR
    print(f"\nThe job's own output is in {job_log}.\nThe incident is stored in {database}: "
          "`watchdog incidents list` shows it.")
    return ExitCode.OK
