"""`watchdog agent`: the per-node agent daemon, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from watchdog import env
from watchdog.cli import options
from watchdog.errors import UsageError


class AgentCommand:
    name = "agent"
    help = "the per-node agent daemon"
    description = ("The per-node agent: finds the workers on this node, reads their beacons, takes "
                   "their stacks when asked, and streams it all to the coordinator. Runs until "
                   "SIGINT or SIGTERM.")
    example = "watchdog agent --coordinator node0:29450 --token-file /etc/torch-hang-watchdog/token"
    daemon = True

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--coordinator", type=options.address, metavar="HOST:PORT",
                       help="default: port 29450 on the MASTER_ADDR of the jobs found on this "
                            "node, else on 127.0.0.1")
        p.add_argument("--beacon-dir", metavar="DIR", help="default: $WATCHDOG_BEACON_DIR or "
                       "/dev/shm/torch-hang-watchdog")
        p.add_argument("--node-name", metavar="N", help="default: the host name")
        p.add_argument("--interval", type=options.positive_float, default=1.0, metavar="S",
                       help="report period (default 1)")
        options.add_native_option(p)
        options.add_client_security_options(p)
        options.add_metrics_option(p)
        options.add_health_option(p, "SERVING while the agent scans and streams to the "
                                     "coordinator; service \"liveness\": while it scans")

    def run(self, args: argparse.Namespace) -> int:
        from agent import Agent
        from watchdog.cli.daemons import STALE_AFTER_S, Vitals, daemon_services

        node = args.node_name or env.short_hostname()
        beacon_dir = args.beacon_dir or env.beacon_dir()
        if os.path.exists(beacon_dir) and not os.path.isdir(beacon_dir):
            raise UsageError(f"the beacon directory {beacon_dir} is not a directory",
                             hint="pass --beacon-dir DIR, the directory the jobs' hooks write "
                                  "to ($WATCHDOG_BEACON_DIR of the jobs)")
        agent = Agent(args.coordinator, beacon_dir, node, args.interval,
                      security=options.client_security_of(args), native=args.native)
        status = (f"{node}: beacons in {beacon_dir}, "
                  f"coordinator {args.coordinator or 'from the jobs MASTER_ADDR'}")
        # A scan may legitimately take a while on a busy node: several intervals, at least 10 s.
        vitals = Vitals(lambda: agent.heartbeat, agent.stream_up,
                        max(STALE_AFTER_S, 5 * args.interval))

        async def serve(stop: asyncio.Event) -> None:
            async with daemon_services(stop, vitals, status, health_listen=args.health_listen,
                                       metrics_listen=args.metrics_listen):
                print(f"watchdog agent {status}", file=sys.stderr, flush=True)
                await agent.run(stop)

        asyncio.run(options.serve_until_signal(serve))
        return 0
