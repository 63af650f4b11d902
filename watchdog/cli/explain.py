"""`watchdog explain LOGFILE...`: NCCL, PyTorch and torchrun error lines, with cause and fix."""

from __future__ import annotations

import argparse
import sys

from watchdog.explain import explain_main


class ExplainCommand:
    name = "explain"
    help = "classify NCCL/torch/torchrun error lines"
    description = ("Reads logs and names the NCCL, PyTorch and torchrun error lines it knows, "
                   "each with its cause and fix, then the first failure. Exit code 1 when an input "
                   "could not be read.")
    example = "torchrun --nproc_per_node=4 train.py 2>&1 | watchdog explain"
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("logfiles", nargs="*", metavar="LOGFILE",
                       help="files; none or - for stdin")
        p.add_argument("--json", action="store_true",
                       help="print the findings as one JSON list (the contract), not as text")

    def run(self, args: argparse.Namespace) -> int:
        return explain_main(args.logfiles, args.json, sys.stdout, sys.stdin)
