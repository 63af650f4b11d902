"""`watchdog launch -- CMD...`: the job with the hook injected and no daemon of its own, for
nodes where the agent runs as a service."""

from __future__ import annotations

import argparse

from watchdog.cli.inject import exec_with_hook

HELP = "run a job with the hook injected, no daemon of our own"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")


def run(args: argparse.Namespace) -> int:
    exec_with_hook(args.cmd)
    return 0  # not reached: exec replaced this process
