"""`watchdog launch -- CMD...`: the job with the hook injected and no daemon of its own, for
nodes where the agent runs as a service."""

from __future__ import annotations

import argparse

from watchdog.supervise.inject import exec_with_hook


class LaunchCommand:
    name = "launch"
    help = "run a job with the hook injected, no daemon of our own"
    description = ("Runs CMD with the hook injected in its Python workers and no daemon of its "
                   "own: for nodes where `watchdog agent` runs as a service and reports to a "
                   "`watchdog coordinator`.")
    example = "watchdog launch -- torchrun --nnodes=2 --nproc_per_node=8 train.py"
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")

    def run(self, args: argparse.Namespace) -> int:
        exec_with_hook(args.cmd)
        return 0  # not reached: exec replaced this process
