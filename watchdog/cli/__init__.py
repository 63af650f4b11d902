"""The `watchdog` command line (the CLI process): `main` parses, then runs one subcommand; each
subcommand is one `Command` class in a module of its own. Nothing else imports this package."""

from watchdog.cli.main import main

__all__ = ["main"]
