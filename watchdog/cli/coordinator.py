"""`watchdog coordinator`: the coordinator daemon, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from watchdog.cli import options
from watchdog.coordinator.store import KEEP_COUNT, KEEP_DAYS
from watchdog.env import DEFAULT_ADDRESS
from watchdog.errors import UsageError

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
    options.add_metrics_option(p)
    options.add_health_option(p, "the gRPC port serves it too; this one is for probes that "
                                 "speak no TLS, such as Kubernetes'")
    p.add_argument("--notify-webhook", action="append", default=[], type=_webhook_url,
                   metavar="URL", help="POST the JSON of each hang incident to URL "
                                       "(repeatable); see the README for Slack and Alertmanager")


def _webhook_url(text: str) -> str:
    from watchdog.coordinator.webhook import check_url

    try:
        return check_url(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(e.args[0]) from None


def run(args: argparse.Namespace) -> int:
    from watchdog.cli.service import Vitals, daemon_services
    from watchdog.coordinator import Coordinator, IncidentStore, default_db_path
    from watchdog.coordinator.gauges import keep_sampled
    from watchdog.coordinator.webhook import Webhooks
    from watchdog.transport import Health, server_security, start_server

    security = server_security(args.token_file, args.tls_cert, args.tls_key, args.tls_client_ca)
    store = IncidentStore(args.db or default_db_path(), args.keep, args.keep_days)
    coordinator = Coordinator(store, options.stall_policy(args))
    webhooks = Webhooks(args.notify_webhook)
    if webhooks.hooks:
        coordinator.listeners.append(webhooks)

    async def serve(stop: asyncio.Event) -> None:
        health = await Health.create()
        server, port = await start_server(coordinator, args.listen, security, health)
        status = f"listening on {args.listen} (port {port}), incidents in {store.path}"
        try:
            async with daemon_services(stop, Vitals(lambda: coordinator.heartbeat), status,
                                       health, args.health_listen, args.metrics_listen):
                print(f"watchdog coordinator {status}", file=sys.stderr, flush=True)
                sampled = [keep_sampled(coordinator, stop)] if args.metrics_listen else []
                await asyncio.gather(coordinator.run(stop), *sampled)
        finally:
            await server.stop(grace=1.0)
            await asyncio.to_thread(webhooks.close)

    try:
        asyncio.run(options.serve_until_signal(serve))
    finally:
        store.close()
    return 0
