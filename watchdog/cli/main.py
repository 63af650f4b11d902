"""The `watchdog` parser: one subcommand per `Command` in `COMMANDS`, each with its own options
and body; errors become the exit codes `ExitCode` defines."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import textwrap
from collections.abc import Sequence
from typing import NoReturn

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


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the example's own line (a command wrapped would not paste), and shows each option's
    default where its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], "", argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)".lstrip()

    def _split_lines(self, text: str, width: int) -> list[str]:
        # An option named in a help text stays whole: "--stall-floor", never "--stall-" "floor".
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """A usage error says what was wrong, then where to look, as every command error does."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n"
                                  f"  hint: `{self.prog} --help` says what it takes\n")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each subcommand's own (whose usage a bad option of it gets)."""
    parser = Parser(
        prog="watchdog", description="Names the rank that hung your torchrun job, with evidence.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=Parser)
    parsers: dict[str, argparse.ArgumentParser] = {}
    for command in COMMANDS:
        parsers[command.name] = sub.add_parser(
            command.name, help=command.help, description=textwrap.fill(command.description, 78),
            epilog=f"example:\n  {command.example}", formatter_class=HelpFormatter)
        command.prepare_parser(parsers[command.name])
    return parser, parsers


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; an option the subcommand does not know is a usage error with that
    subcommand's usage, not the top level's (argparse leaves them to the top level)."""
    parser, parsers = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
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
