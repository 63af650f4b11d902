"""`watchdog coordinator`: the coordinator daemon, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from watchdog.cli import options
from watchdog.coordinator.service import JOB_RETENTION_S
from watchdog.coordinator.store import KEEP_COUNT, KEEP_DAYS, KEEP_MIB, first_line
from watchdog.env import DEFAULT_ADDRESS, short_hostname, split_address
from watchdog.errors import UsageError

if TYPE_CHECKING:
    from watchdog.coordinator import Coordinator
    from watchdog.coordinator.database import Database
    from watchdog.web import WebAuth, WebView

log = logging.getLogger(__name__)


class CoordinatorCommand:
    name = "coordinator"
    help = "the coordinator daemon"
    description = ("The coordinator: joins the agents' reports into jobs, names the rank that hung "
                   "each, stores incidents and answers `watchdog status`. Runs until SIGINT or "
                   "SIGTERM.")
    example = ("watchdog coordinator --listen 0.0.0.0:29450 --token-file /et"
               "c/torch-hang-watchdog/token")
    daemon = True

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--listen", default=DEFAULT_ADDRESS, type=options.address,
                       metavar="HOST:PORT",
                       help="serve gRPC (agents, `watchdog status`) on HOST:PORT")
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
        p.add_argument("--keep-mib", type=options.positive_int, default=KEEP_MIB, metavar="M",
                       help="drop the oldest incidents while the database holds more than M MiB "
                            f"(default {KEEP_MIB}; the newest is always kept)")
        p.add_argument("--job-retention", type=options.positive_float, default=JOB_RETENTION_S,
                       metavar="S", help="forget a job no agent reported for S seconds (default "
                                         f"{JOB_RETENTION_S:.0f})")
        options.add_stall_options(p)
        options.add_metrics_option(p)
        options.add_health_option(p, "the gRPC port serves it too; this one is for probes that "
                                     "speak no TLS, such as Kubernetes'")
        p.add_argument("--notify-webhook", action="append", default=[], type=_webhook_url,
                       metavar="URL", help="POST the JSON of each hang incident to URL "
                                           "(repeatable); see the README for Slack and "
                                           "Alertmanager")
        p.add_argument("--web-listen", metavar="HOST:PORT",
                       help="also serve a read-only web view of jobs, ranks and incidents "
                            "here (off by default; with a token, readers sign in with the "
                            "reader's or control's; without one, root and this user only)")

    def run(self, args: argparse.Namespace) -> int:
        from watchdog.cli.daemons import Vitals, daemon_services
        from watchdog.coordinator import Coordinator, store_for
        from watchdog.coordinator.database import database_of
        from watchdog.coordinator.gauges import keep_sampled
        from watchdog.coordinator.store import Retention
        from watchdog.coordinator.webhook import Webhooks
        from watchdog.errors import StoreUnavailableError
        from watchdog.transport import Health, server_security, start_server
        from watchdog.transport.roles import role_tokens
        from watchdog.web import WebAuth

        database = database_of(args.db)
        security = server_security(
            args.token_file, args.tls_cert, args.tls_key, args.tls_client_ca,
            {role: getattr(args, f"{role}_token_file")
             for role in ("agent", "reader", "control")})
        store = store_for(database, Retention(args.keep, args.keep_days, args.keep_mib << 20),
                          coordinator=_name(args.listen))
        try:
            store.open()
        except StoreUnavailableError as e:
            # A server that is not up yet (a machine booting, a failover): refusing to start
            # would leave every job unwatched, and a supervisor restarting it in a loop.
            log.error("%s; incidents are logged, kept and stored once it answers", first_line(e))
        coordinator = Coordinator(store, options.stall_policy(args),
                                  job_retention=args.job_retention)
        webhooks = Webhooks(args.notify_webhook, owner_of=coordinator.owner_of)
        if webhooks.hooks:
            coordinator.listeners.append(webhooks)
        # The web view shows what Status does, to whom Status would.
        web_auth = (None if args.web_listen is None
                    else WebAuth(role_tokens(security), args.web_listen))

        async def serve(stop: asyncio.Event) -> None:
            health = await Health.create()
            server, port = await start_server(coordinator, args.listen, security, health)
            status = f"listening on {args.listen} (port {port}), incidents in {store.where}"
            web = None
            try:
                async with daemon_services(stop, Vitals(lambda: coordinator.heartbeat), status,
                                           health, args.health_listen, args.metrics_listen):
                    print(f"watchdog coordinator {status}", file=sys.stderr, flush=True)
                    if web_auth is not None:
                        web = _start_web(args, coordinator, web_auth, database)
                    sampled = [keep_sampled(coordinator, stop)] if args.metrics_listen else []
                    await asyncio.gather(coordinator.run(stop), *sampled)
            finally:
                if web is not None:
                    await asyncio.to_thread(web.stop)
                await server.stop(grace=1.0)
                await asyncio.to_thread(webhooks.close)
                await coordinator.saver.close()

        asyncio.run(options.serve_until_signal(serve))
        return 0


def _webhook_url(text: str) -> str:
    from watchdog.coordinator.webhook import check_url

    try:
        return check_url(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(e.args[0]) from None


def _name(listen: str) -> str:
    """How the incidents it stores name this coordinator: its host, and the port that tells
    two coordinators of one host apart."""
    return f"{short_hostname()}:{split_address(listen)[1]}"


def _start_web(args: argparse.Namespace, coordinator: Coordinator, auth: WebAuth,
               database: Database) -> WebView:
    from watchdog.web import CoordinatorSource, WebView, tls_context

    source = CoordinatorSource(coordinator, asyncio.get_running_loop(), database)
    web = WebView(args.web_listen, source, auth, tls_context(args.tls_cert, args.tls_key))
    web.start()
    scheme = "https" if args.tls_cert else "http"
    print(f"watchdog coordinator web view on {scheme}://{args.web_listen}/ (port {web.port})",
          file=sys.stderr, flush=True)
    return web
