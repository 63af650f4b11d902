"""The `watchdog` parser: one subcommand per `Command` in `COMMANDS`, each with its own options
and body; errors become the exit codes `ExitCode` defines."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence

from watchdog import __version__
from watchdog.cli.agent import AgentCommand
from watchdog.cli.check import CheckCommand
from watchdog.cli.command import Command
from watchdog.cli.coordinator import CoordinatorCommand
from watchdog.cli.demo import DemoCommand
from watchdog.cli.doctor import DoctorCommand
from watchdog.cli.explain import ExplainCommand
from watchdog.cli.incidents import IncidentsCommand
from watchdog.cli.launch import LaunchCommand
from watchdog.cli.run import RunCommand
from watchdog.cli.status import StatusCommand
from watchdog.errors import ExitCode, UsageError, WatchdogError

# In the order `watchdog --help` lists them.
COMMANDS: tuple[Command, ...] = (
    RunCommand(), LaunchCommand(), DemoCommand(), AgentCommand(), CoordinatorCommand(),
    StatusCommand(), IncidentsCommand(), ExplainCommand(), DoctorCommand(), CheckCommand(),
)
DAEMONS = tuple(command.name for command in COMMANDS if command.daemon)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="watchdog", description="Names the rank that hung your torchrun job, with evidence.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.prepare_parser(sub.add_parser(command.name, help=command.help))
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
            return int(_named(args.command).run(args))
        return ExitCode.OK
    except UsageError as e:
        print(f"watchdog: {e}", file=sys.stderr)
        return ExitCode.USAGE
    except WatchdogError as e:
        print(f"watchdog: {e}", file=sys.stderr)
        return ExitCode.ERROR
    except (KeyboardInterrupt, asyncio.CancelledError):
        return ExitCode.INTERRUPTED


def _named(name: str) -> Command:
    return next(command for command in COMMANDS if command.name == name)
