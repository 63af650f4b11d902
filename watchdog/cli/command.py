"""What every `watchdog` subcommand is: one class per subcommand, in that subcommand's module, and
`main.COMMANDS` lists one instance of each, so that mypy checks each against `Command`."""

from __future__ import annotations

import argparse
from typing import Protocol


class Command(Protocol):
    """One `watchdog` subcommand: its word, its line in `watchdog --help`, its options, its body."""

    name: str
    help: str
    # What `watchdog NAME --help` says above the options, and the example it ends with.
    description: str
    example: str
    # A daemon logs what it sees by default (INFO); any other command only what went wrong.
    daemon: bool

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        """Adds this subcommand's options and arguments to its own parser."""

    def run(self, args: argparse.Namespace) -> int:
        """Does the work; returns the exit code (an `ExitCode`, or a job's own code for `run`).
        A `UsageError` or `WatchdogError` it raises becomes `ExitCode.USAGE` or `.ERROR`."""
