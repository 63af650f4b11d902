"""The `watchdog` command line (the CLI process): `main` parses, then runs one subcommand; each
module here owns one subcommand's options and body. Nothing else imports this package."""

from watchdog.cli.main import main

__all__ = ["main"]
