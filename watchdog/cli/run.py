"""`watchdog run -- CMD...`: the job, with the hook injected, beside an embedded agent and
coordinator; prints each incident, and ends the job on a hang with `--on-hang kill`."""

from __future__ import annotations

import argparse
import asyncio
import sys

from watchdog.cli import options
from watchdog.report.terminal import use_color


class RunCommand:
    name = "run"
    help = "run a job with an embedded agent and coordinator"
    description = ("Runs CMD with the hook injected in its Python workers, beside an embedded "
                   "agent and coordinator: says which job it watches, prints each incident (and "
                   "stores it), and on a hang keeps the job running, ends it or restarts its "
                   "workers (--on-hang). A rank's exit is the launcher's to handle (torchrun "
                   "stops the other workers and restarts or fails the job): --on-hang acts on "
                   "one only when the other ranks still wait a stall threshold after it. Exit "
                   "code: the job's; 3 when --on-hang kill ended a hung job; 130 when you "
                   "interrupted it (Ctrl-C).")
    example = ("watchdog run --on-hang kill --report-html hang.html "
               "-- torchrun --nproc_per_node=4 train.py")
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        options.add_stall_options(p)
        p.add_argument("--on-hang", choices=("report", "kill", "restart"), default="report",
                       help="after a hang's diagnosis: keep the job running (report), end it "
                            "(kill), or end the hung attempt's workers so that torchrun "
                            "restarts them while --max-restarts allows (restart: each such "
                            "restart counts against --max-restarts, as any failure does). A "
                            "rank's exit is torchrun's to handle: acted on only when the other "
                            "ranks still wait a stall threshold after it")
        p.add_argument("--report", type=options.file_to_write, metavar="PATH",
                       help="write the incident JSON to PATH")
        p.add_argument("--report-html", type=options.file_to_write, metavar="PATH",
                       help="write the first hang incident to PATH as one self-contained HTML "
                            "page")
        options.add_db_option(p)
        options.add_native_option(p)
        options.add_metrics_option(p)
        p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")

    def run(self, args: argparse.Namespace) -> int:
        from watchdog.coordinator.database import database_of
        from watchdog.supervise.embedded import RunOptions, run_job

        run_options = RunOptions(args.cmd, options.stall_policy(args), args.on_hang,
                                 args.report, args.report_html, database_of(args.db),
                                 use_color(sys.stderr), args.native,
                                 metrics_listen=args.metrics_listen, framed=True)
        return asyncio.run(run_job(run_options))
