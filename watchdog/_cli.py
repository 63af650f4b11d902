"""The `watchdog` command line (CLI process): parses arguments, maps errors to exit codes.

Exit codes: 0 success; 1 a WatchdogError (its hint is printed); 2 bad usage; 3 `run` detected a
hang and ended the job (`--on-hang kill`); otherwise `run` returns the job's own exit code;
130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from watchdog import _commands
from watchdog._errors import UsageError, WatchdogError
from watchdog._rpc import DEFAULT_ADDRESS
from watchdog._store import KEEP_COUNT, KEEP_DAYS

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _add_stall_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stall-timeout", type=float, metavar="S",
                   help="call a job hung after S seconds without progress (fixed; default: "
                        "adaptive, see --stall-floor/--stall-k/--stall-warmup)")
    p.add_argument("--stall-floor", type=float, default=10.0, metavar="S",
                   help="adaptive threshold never below S seconds (default 10)")
    p.add_argument("--stall-k", type=float, default=5.0, metavar="K",
                   help="adaptive threshold = K x p99 progress interval (default 5)")
    p.add_argument("--stall-warmup", type=float, default=60.0, metavar="S",
                   help="grace while too few progress intervals were seen (default 60)")


def _add_db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="PATH",
                   help="incident database (default: $WATCHDOG_DB, /var/lib/torch-hang-watchdog/"
                        "incidents.db as root, ~/.local/state/torch-hang-watchdog/ otherwise)")


def _add_token_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-file", metavar="F",
                   help="the shared token, in a file other users cannot read, e.g. mode 600 "
                        "(default: $WATCHDOG_TOKEN; none: no token)")


def _add_client_security_options(p: argparse.ArgumentParser) -> None:
    _add_token_option(p)
    p.add_argument("--tls-ca", metavar="PEM", help="speak TLS; trust the coordinator's "
                   "certificate when this CA signed it")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="client certificate's private key")


def _add_native_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--native", action="store_true",
                   help="stacks with native (C/C++) frames too; Python frames alone where that "
                        "fails or takes over 3 s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="watchdog", description="Names the rank that hung your torchrun job, with evidence.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run a job with an embedded agent and coordinator")
    _add_stall_options(p)
    p.add_argument("--on-hang", choices=("report", "kill"), default="report",
                   help="after a diagnosis: keep the job running (report) or end it (kill)")
    p.add_argument("--report", metavar="PATH", help="write the incident JSON to PATH")
    _add_db_option(p)
    _add_native_option(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")

    p = sub.add_parser("launch", help="run a job with the hook injected, no daemon of our own")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")

    p = sub.add_parser("demo", help="a 4-rank CPU job with an injected hang, diagnosed live")
    _add_db_option(p)

    p = sub.add_parser("agent", help="the per-node agent daemon")
    p.add_argument("--coordinator", metavar="HOST:PORT",
                   help="default: port 29450 on the MASTER_ADDR of the jobs found on this "
                        "node, else on 127.0.0.1")
    p.add_argument("--beacon-dir", metavar="DIR", help="default: $WATCHDOG_BEACON_DIR or "
                   "/dev/shm/torch-hang-watchdog")
    p.add_argument("--node-name", metavar="N", help="default: the host name")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="report period")
    _add_native_option(p)
    _add_client_security_options(p)

    p = sub.add_parser("coordinator", help="the coordinator daemon")
    p.add_argument("--listen", default=DEFAULT_ADDRESS, metavar="HOST:PORT")
    _add_token_option(p)
    p.add_argument("--tls-cert", metavar="PEM", help="speak TLS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--tls-client-ca", metavar="PEM",
                   help="require client certificates signed by this CA")
    _add_db_option(p)
    p.add_argument("--keep", type=int, default=KEEP_COUNT, metavar="N",
                   help=f"keep the newest N incidents (default {KEEP_COUNT})")
    p.add_argument("--keep-days", type=float, default=KEEP_DAYS, metavar="D",
                   help=f"drop incidents older than D days (default {KEEP_DAYS:.0f})")
    _add_stall_options(p)

    p = sub.add_parser("status", help="jobs, ranks and the current verdict")
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, metavar="HOST:PORT")
    _add_client_security_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable (the contract)")

    p = sub.add_parser("incidents", help="stored incidents")
    p.add_argument("action", nargs="?", choices=("list", "show"), default="list")
    p.add_argument("id", nargs="?", help="incident id (for show)")
    p.add_argument("--json", action="store_true")
    _add_db_option(p)

    p = sub.add_parser("explain", help="classify NCCL/torch/torchrun error lines")
    p.add_argument("logfiles", nargs="*", metavar="LOGFILE", help="files; none or - for stdin")
    p.add_argument("--json", action="store_true")

    sub.add_parser("doctor", help="preflight checks: ptrace, py-spy, torch, names")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The daemons log what they see by default; the other commands only what went wrong.
    quiet = 0 if args.command in ("agent", "coordinator") else 1
    level = (logging.INFO, logging.WARNING)[quiet] if args.verbose == 0 else (
        logging.INFO if args.verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return _commands.dispatch(args)
    except UsageError as e:
        print(f"watchdog: {e}", file=sys.stderr)
        return EXIT_USAGE
    except WatchdogError as e:
        print(f"watchdog: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (KeyboardInterrupt, asyncio.CancelledError):
        return EXIT_INTERRUPTED
