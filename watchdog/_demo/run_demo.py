"""`watchdog demo` (CLI process): a 4-rank CPU job whose rank 2 hangs in its data pipeline."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from watchdog._errors import WatchdogError
from watchdog._run import EXIT_HANG_KILLED, RunOptions, run_job
from watchdog._stall import StallPolicy

TRAIN_SCRIPT = str(Path(__file__).with_name("train.py"))
DEMO_STALL_TIMEOUT_S = 5.0


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


def run_demo(db_path: str, color: bool) -> int:
    if importlib.util.find_spec("torch") is None:
        raise WatchdogError("the demo needs torch in this environment",
                            hint="pip install 'torch-hang-watchdog[test]' (or any torch build)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cmd = torchrun_command(4, "--fault", "data_stall", "--fault-rank", "2", "--fault-step", "6")
    print("watchdog demo: 4 ranks train a small DDP model on CPU (gloo); at step 6 rank 2 "
          "blocks reading a sample.\nwatchdog run watches it and names the rank within "
          f"{DEMO_STALL_TIMEOUT_S:.0f}s of the last progress.\n$ watchdog run --stall-timeout "
          f"{DEMO_STALL_TIMEOUT_S:.0f} --on-hang kill -- torchrun --nproc_per_node=4 train.py "
          "--fault data_stall --fault-rank 2\n", flush=True)
    # The job's own output (torchrun's shutdown traceback among it) would bury the diagnosis.
    job_log = os.path.join(tempfile.gettempdir(), f"watchdog-demo-{os.getpid()}.log")
    options = RunOptions(cmd, StallPolicy(fixed=DEMO_STALL_TIMEOUT_S), on_hang="kill",
                         db_path=db_path, color=color, job_log=job_log)
    code = asyncio.run(run_job(options, out=sys.stdout))
    if code != EXIT_HANG_KILLED:
        print(f"watchdog demo: the job ended with exit code {code} before a diagnosis; the end "
              f"of its output ({job_log}):")
        print("".join(Path(job_log).read_text(errors="replace").splitlines(True)[-20:]))
        return 1
    print(f"\nThe job's own output is in {job_log}.\nThe incident is stored in {db_path}: "
          "`watchdog incidents list` shows it.")
    return 0
