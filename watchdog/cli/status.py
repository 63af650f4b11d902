"""`watchdog status`: the jobs a coordinator follows, their ranks and current verdicts."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from watchdog.cli import options
from watchdog.cli.render import render_status, use_color
from watchdog.env import DEFAULT_ADDRESS

HELP = "jobs, ranks and the current verdict"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, metavar="HOST:PORT")
    options.add_client_security_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable (the contract)")


def run(args: argparse.Namespace) -> int:
    from watchdog.transport import CoordinatorClient

    async def fetch() -> str:
        client = CoordinatorClient(args.coordinator, options.client_security_of(args))
        try:
            return await client.status_json()
        finally:
            await client.close()

    text = asyncio.run(fetch())
    print(text if args.json else render_status(json.loads(text), color=use_color(sys.stdout)))
    return 0
