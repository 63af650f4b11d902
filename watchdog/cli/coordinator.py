"""`watchdog coordinator`: the coordinator daemon, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from watchdog.cli import options
from watchdog.coordinator.service import JOB_RETENTION_S
from watchdog.coordinator.store import KEEP_COUNT, KEEP_DAYS
from watchdog.env import DEFAULT_ADDRESS

HELP = "the coordinator daemon"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default=DEFAULT_ADDRESS, metavar="HOST:PORT")
    options.add_token_option(p)
    for role, may in (("agent", "send reports and answer stack requests"),
                      ("reader", "read every job (watchdog status)"),
                      ("control", "read, and act on jobs")):
        p.add_argument(f"--{role}-token-file", metavar="F",
                       help=f"the token that may {may}, in place of --token-file's")
    p.add_argument("--tls-cert", metavar="PEM", help="speak TLS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--tls-client-ca", metavar="PEM",
                   help="require client certificates signed by this CA")
    options.add_db_option(p)
    p.add_argument("--keep", type=options.positive_int, default=KEEP_COUNT, metavar="N",
                   help=f"keep the newest N incidents (default {KEEP_COUNT})")
    p.add_argument("--keep-days", type=options.positive_float, default=KEEP_DAYS, metavar="D",
                   help=f"drop incidents older than D days (default {KEEP_DAYS:.0f})")
    p.add_argument("--job-retention", type=options.positive_float, default=JOB_RETENTION_S,
                   metavar="S", help="forget a job no agent reported for S seconds (default "
                                     f"{JOB_RETENTION_S:.0f})")
    options.add_stall_options(p)


def run(args: argparse.Namespace) -> int:
    from watchdog.coordinator import Coordinator, IncidentStore, default_db_path
    from watchdog.transport import server_security, start_server

    security = server_security(
        args.token_file, args.tls_cert, args.tls_key, args.tls_client_ca,
        {role: getattr(args, f"{role}_token_file") for role in ("agent", "reader", "control")})
    store = IncidentStore(args.db or default_db_path(), args.keep, args.keep_days)
    store.open()
    coordinator = Coordinator(store, options.stall_policy(args),
                              job_retention=args.job_retention)

    async def serve(stop: asyncio.Event) -> None:
        server, port = await start_server(coordinator, args.listen, security)
        print(f"watchdog coordinator listening on {args.listen} (port {port}), "
              f"incidents in {store.path}", file=sys.stderr, flush=True)
        try:
            await coordinator.run(stop)
        finally:
            await server.stop(grace=1.0)
            await coordinator.saver.close()

    asyncio.run(options.serve_until_signal(serve))
    return 0
