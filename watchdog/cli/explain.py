"""`watchdog explain LOGFILE...`: NCCL, PyTorch and torchrun error lines, with cause and fix."""

from __future__ import annotations

import argparse
import sys

from watchdog.explain import explain_main


class ExplainCommand:
    name = "explain"
    help = "classify NCCL/torch/torchrun error lines"
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("logfiles", nargs="*", metavar="LOGFILE",
                       help="files; none or - for stdin")
        p.add_argument("--json", action="store_true")

    def run(self, args: argparse.Namespace) -> int:
        return explain_main(args.logfiles, args.json, sys.stdout, sys.stdin)
