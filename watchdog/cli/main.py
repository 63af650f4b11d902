"""The `watchdog` parser: one subcommand per module of this package, each with its own options
and body; errors become the exit codes `ExitCode` defines."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from watchdog import __version__
from watchdog.cli import (
    agent,
    check,
    coordinator,
    demo,
    doctor,
    explain,
    incidents,
    launch,
    run,
    status,
)
from watchdog.errors import ExitCode, UsageError, WatchdogError

# Each module has HELP, add_arguments(parser) and run(args) -> exit code.
COMMANDS: dict[str, ModuleType] = {
    "run": run, "launch": launch, "demo": demo, "agent": agent, "coordinator": coordinator,
    "status": status, "incidents": incidents, "explain": explain, "doctor": doctor,
    "check": check,
}
DAEMONS = ("agent", "coordinator")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="watchdog", description="Names the rank that hung your torchrun job, with evidence.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The daemons log what they see by default; the other commands only what went wrong.
    quiet = args.command not in DAEMONS
    level = (logging.INFO, logging.WARNING)[quiet] if args.verbose == 0 else (
        logging.INFO if args.verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        with contextlib.suppress(BrokenPipeError):
            return int(COMMANDS[args.command].run(args))
        return ExitCode.OK
    except UsageError as e:
        print(f"watchdog: {e}", file=sys.stderr)
        return ExitCode.USAGE
    except WatchdogError as e:
        print(f"watchdog: {e}", file=sys.stderr)
        return ExitCode.ERROR
    except (KeyboardInterrupt, asyncio.CancelledError):
        return ExitCode.INTERRUPTED
