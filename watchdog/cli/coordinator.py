"""`watchdog coordinator`: the coordinator daemon, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from watchdog.cli import options
from watchdog.coordinator.store import KEEP_COUNT, KEEP_DAYS
from watchdog.env import DEFAULT_ADDRESS

if TYPE_CHECKING:
    from watchdog.coordinator import Coordinator
    from watchdog.web import WebAuth, WebView

HELP = "the coordinator daemon"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default=DEFAULT_ADDRESS, metavar="HOST:PORT")
    options.add_token_option(p)
    p.add_argument("--tls-cert", metavar="PEM", help="speak TLS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--tls-client-ca", metavar="PEM",
                   help="require client certificates signed by this CA")
    options.add_db_option(p)
    p.add_argument("--keep", type=options.positive_int, default=KEEP_COUNT, metavar="N",
                   help=f"keep the newest N incidents (default {KEEP_COUNT})")
    p.add_argument("--keep-days", type=options.positive_float, default=KEEP_DAYS, metavar="D",
                   help=f"drop incidents older than D days (default {KEEP_DAYS:.0f})")
    options.add_stall_options(p)
    p.add_argument("--web-listen", metavar="HOST:PORT",
                   help="also serve a read-only web view of jobs, ranks and incidents here (off "
                        "by default; with a token, readers sign in with it; without one, "
                        "loopback only)")


def run(args: argparse.Namespace) -> int:
    from watchdog.coordinator import Coordinator, IncidentStore, default_db_path
    from watchdog.transport import server_security, start_server
    from watchdog.web import WebAuth

    security = server_security(args.token_file, args.tls_cert, args.tls_key, args.tls_client_ca)
    store = IncidentStore(args.db or default_db_path(), args.keep, args.keep_days)
    coordinator = Coordinator(store, options.stall_policy(args))
    web_auth = None if args.web_listen is None else WebAuth(security.token, args.web_listen)

    async def serve(stop: asyncio.Event) -> None:
        server, port = await start_server(coordinator, args.listen, security)
        print(f"watchdog coordinator listening on {args.listen} (port {port}), "
              f"incidents in {store.path}", file=sys.stderr, flush=True)
        web = None
        try:
            if web_auth is not None:
                web = _start_web(args, coordinator, web_auth, store.path)
            await coordinator.run(stop)
        finally:
            if web is not None:
                await asyncio.to_thread(web.stop)
            await server.stop(grace=1.0)

    try:
        asyncio.run(options.serve_until_signal(serve))
    finally:
        store.close()
    return 0


def _start_web(args: argparse.Namespace, coordinator: Coordinator, auth: WebAuth,
               db_path: str) -> WebView:
    from watchdog.web import CoordinatorSource, WebView, tls_context

    source = CoordinatorSource(coordinator, asyncio.get_running_loop(), db_path)
    web = WebView(args.web_listen, source, auth, tls_context(args.tls_cert, args.tls_key))
    web.start()
    scheme = "https" if args.tls_cert else "http"
    print(f"watchdog coordinator web view on {scheme}://{args.web_listen}/ (port {web.port})",
          file=sys.stderr, flush=True)
    return web
