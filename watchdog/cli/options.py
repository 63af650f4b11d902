"""Options and helpers several subcommands share (CLI process).

Numbers are checked by argparse itself, so a bad one is a usage error (exit 2) that names the
option, before any command starts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from watchdog.coordinator.stall import StallPolicy
from watchdog.env import split_address
from watchdog.errors import UsageError
from watchdog.transport import ClientSecurity, client_security


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def file_to_write(text: str) -> str:
    """A PATH the command will write a file to, checked before the job starts: a directory
    found only once a hang is diagnosed would lose the report."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory: give a file path, e.g. "
                                         f"{os.path.join(text, 'hang.json')}")
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory):
        raise argparse.ArgumentTypeError(f"cannot write {text}: no directory {directory}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {directory} is not writable "
                                         "by this user")
    return text


def add_stall_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stall-timeout", type=positive_float, metavar="S",
                   help="call a job hung after S seconds without progress (fixed; default: "
                        "adaptive, see --stall-floor/--stall-k/--stall-warmup)")
    p.add_argument("--stall-floor", type=positive_float, default=10.0, metavar="S",
                   help="adaptive threshold never below S seconds (default 10)")
    p.add_argument("--stall-k", type=positive_float, default=5.0, metavar="K",
                   help="adaptive threshold = K x p99 progress interval (default 5)")
    p.add_argument("--stall-warmup", type=positive_float, default=60.0, metavar="S",
                   help="grace before the first 3 steps, while no progress interval is known "
                        "(default 60)")
    p.add_argument("--busy-timeout", type=positive_float, default=600.0, metavar="S",
                   help="a rank that keeps working (CPU, I/O, a moving stack) while its peers "
                        "wait is reported busy, and hung only after S seconds (default 600; "
                        "--stall-timeout does not shorten it)")


def stall_policy(args: argparse.Namespace) -> StallPolicy:
    return StallPolicy(floor=args.stall_floor, k=args.stall_k, warmup=args.stall_warmup,
                       fixed=args.stall_timeout, busy_timeout=args.busy_timeout)


def add_db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="PATH|URL",
                   help="incident database: a SQLite file, or a postgresql:// URL that several "
                        "coordinators share (the postgres extra; the password not here but in "
                        "~/.pgpass, $PGPASSFILE or $PGPASSWORD) (default: $WATCHDOG_DB, else "
                        "$STATE_DIRECTORY/incidents.db in a systemd unit that has one, else "
                        "/var/lib/torch-hang-watchdog/incidents.db as root, ~/.local/state/"
                        "torch-hang-watchdog/incidents.db for other users)")


def add_token_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-file", metavar="F",
                   help="the shared token, in a file other users cannot read, e.g. mode 600 "
                        "(default: $WATCHDOG_TOKEN; none: no token)")


def add_client_security_options(p: argparse.ArgumentParser) -> None:
    add_token_option(p)
    p.add_argument("--tls-ca", metavar="PEM", help="speak TLS; trust the coordinator's "
                   "certificate when this CA signed it")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="client certificate's private key")


def client_security_of(args: argparse.Namespace) -> ClientSecurity:
    return client_security(args.token_file, args.tls_ca, args.tls_cert, args.tls_key)


def add_native_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--native", action="store_true",
                   help="stacks with native (C/C++) frames too; Python frames alone where that "
                        "fails or takes over 3 s")


def address(text: str) -> str:
    """A HOST:PORT option, checked before any daemon starts."""
    try:
        split_address(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(f"{e.args[0]} ({e.hint})") from None
    return text


def add_metrics_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-listen", type=address, metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics")


def add_health_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--health-listen", type=address, metavar="HOST:PORT",
                   help=f"serve the gRPC health service alone, in plaintext, on HOST:PORT ({what})")


async def serve_until_signal(body: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
    """Run a daemon's `body` until SIGINT or SIGTERM sets the event it watches."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await body(stop)
