"""One function per `watchdog` subcommand (CLI process)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from watchdog import _env
from watchdog._auth import ClientSecurity, client_security, server_security
from watchdog._errors import UsageError, WatchdogError
from watchdog._stall import StallPolicy
from watchdog._store import IncidentStore, default_db_path


def stall_policy(args: argparse.Namespace) -> StallPolicy:
    for name in ("stall_timeout", "stall_floor", "stall_k", "stall_warmup"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, not {value}")
    return StallPolicy(floor=args.stall_floor, k=args.stall_k, warmup=args.stall_warmup,
                       fixed=args.stall_timeout)


def _client_security(args: argparse.Namespace) -> ClientSecurity:
    return client_security(args.token_file, args.tls_ca, args.tls_cert, args.tls_key)


def _color(stream: Any) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ


def cmd_run(args: argparse.Namespace) -> int:
    from watchdog._run import RunOptions, run_job

    options = RunOptions(args.cmd, stall_policy(args), args.on_hang, args.report,
                         args.db or default_db_path(), _color(sys.stderr), args.native)
    return asyncio.run(run_job(options))


def cmd_launch(args: argparse.Namespace) -> int:
    from watchdog._launch import exec_with_hook

    exec_with_hook(args.cmd)
    return 0  # not reached: exec replaced this process


def cmd_demo(args: argparse.Namespace) -> int:
    from watchdog._demo.run_demo import run_demo

    return run_demo(args.db or default_db_path(), _color(sys.stderr))


async def _serve_until_signal(body: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await body(stop)


def cmd_agent(args: argparse.Namespace) -> int:
    from agent._daemon import Agent

    if args.interval <= 0:
        raise UsageError(f"--interval must be positive, not {args.interval}")
    node = args.node_name or socket.gethostname().split(".")[0]
    beacon_dir = args.beacon_dir or _env.beacon_dir()
    agent = Agent(args.coordinator, beacon_dir, node, args.interval,
                  security=_client_security(args), native=args.native)
    print(f"watchdog agent {node}: beacons in {beacon_dir}, "
          f"coordinator {args.coordinator or 'from the jobs MASTER_ADDR'}",
          file=sys.stderr, flush=True)
    asyncio.run(_serve_until_signal(agent.run))
    return 0


def cmd_coordinator(args: argparse.Namespace) -> int:
    from watchdog._coordinator import Coordinator
    from watchdog._rpc import start_server

    if args.keep <= 0 or args.keep_days <= 0:
        raise UsageError("--keep and --keep-days must be positive")
    security = server_security(args.token_file, args.tls_cert, args.tls_key, args.tls_client_ca)
    store = IncidentStore(args.db or default_db_path(), args.keep, args.keep_days)
    coordinator = Coordinator(store, stall_policy(args))

    async def serve(stop: asyncio.Event) -> None:
        server, port = await start_server(coordinator, args.listen, security)
        print(f"watchdog coordinator listening on {args.listen} (port {port}), "
              f"incidents in {store.path}", file=sys.stderr, flush=True)
        try:
            await coordinator.run(stop)
        finally:
            await server.stop(grace=1.0)

    try:
        asyncio.run(_serve_until_signal(serve))
    finally:
        store.close()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from watchdog._render import render_status
    from watchdog._rpc import CoordinatorClient

    async def fetch() -> str:
        client = CoordinatorClient(args.coordinator, _client_security(args))
        try:
            return await client.status_json()
        finally:
            await client.close()

    text = asyncio.run(fetch())
    print(text if args.json else render_status(json.loads(text), color=_color(sys.stdout)))
    return 0


def cmd_incidents(args: argparse.Namespace) -> int:
    from watchdog._render import render_incident, render_incident_list

    store = IncidentStore(args.db or default_db_path())
    try:
        if args.action == "show":
            if not args.id:
                raise UsageError("incidents show needs an incident id",
                                 hint="`watchdog incidents list` shows them")
            body = store.get_json(args.id)
            if body is None:
                raise WatchdogError(f"no incident {args.id} in {store.path}")
            print(body if args.json else render_incident(json.loads(body), _color(sys.stdout)))
        elif args.json:
            print("[" + ", ".join(store.list_json()) + "]")
        else:
            print(render_incident_list([json.loads(b) for b in store.list_json()]))
    finally:
        store.close()
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from watchdog._explain import explain_main

    return explain_main(args.logfiles, args.json, sys.stdout, sys.stdin)


def cmd_doctor(args: argparse.Namespace) -> int:
    from watchdog._doctor import run_doctor

    return run_doctor(sys.stdout)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run, "launch": cmd_launch, "demo": cmd_demo, "agent": cmd_agent,
    "coordinator": cmd_coordinator, "status": cmd_status, "incidents": cmd_incidents,
    "explain": cmd_explain, "doctor": cmd_doctor,
}


def dispatch(args: argparse.Namespace) -> int:
    with contextlib.suppress(BrokenPipeError):
        return COMMANDS[args.command](args)
    return 0
