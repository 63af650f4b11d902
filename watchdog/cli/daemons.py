"""What the daemon commands (`watchdog agent`, `watchdog coordinator`) run around their loops
(CLI process): systemd's notify protocol, the gRPC health service and the Prometheus endpoint.

A daemon is alive while its own loop keeps turning (its heartbeat is recent), not merely while
the event loop answers: a health probe and systemd's watchdog then see a wedged daemon too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from watchdog import metrics
from watchdog.sdnotify import Notifier
from watchdog.transport import Health, start_health_server

log = logging.getLogger(__name__)

HEALTH_PERIOD_S = 1.0
STALE_AFTER_S = 10.0  # a heartbeat older than this: the daemon's loop is stuck


@dataclass(frozen=True)
class Vitals:
    heartbeat: Callable[[], float]  # monotonic time of the daemon loop's last turn
    ready: Callable[[], bool] = lambda: True  # beyond being alive (an agent: its stream is up)
    stale_after: float = STALE_AFTER_S

    def alive(self) -> bool:
        return time.monotonic() - self.heartbeat() < self.stale_after


@contextlib.asynccontextmanager
async def daemon_services(stop: asyncio.Event, vitals: Vitals, status: str,
                          health: Health | None = None, health_listen: str | None = None,
                          metrics_listen: str | None = None) -> AsyncIterator[None]:
    """Around a daemon's body: metrics and health served, systemd told READY=1 once they listen
    (the caller has its own server listening already), WATCHDOG=1 while alive, STOPPING=1 when
    `stop` is set."""
    notifier = Notifier()
    exporter = metrics.serve(metrics_listen) if metrics_listen else None
    health_server = None
    try:
        if health_listen:
            health = health or await Health.create()
            health_server, port = await start_health_server(health_listen, health)
            log.info("health service on %s (port %d)", health_listen, port)
        supervisor = asyncio.create_task(_supervise(stop, vitals, health, notifier, status))
        try:
            yield
        finally:
            stop.set()
            await supervisor
    finally:
        if health_server is not None:
            await health_server.stop(grace=None)
        if exporter is not None:
            exporter.close()


async def _supervise(stop: asyncio.Event, vitals: Vitals, health: Health | None,
                     notifier: Notifier, status: str) -> None:
    notifier.ready(status)
    try:
        await asyncio.gather(_keep_health(stop, vitals, health),
                             _keep_pinging(stop, vitals, notifier))
    finally:
        notifier.stopping()
        if health is not None:
            await health.shutdown()


async def _keep_health(stop: asyncio.Event, vitals: Vitals, health: Health | None) -> None:
    while health is not None and not stop.is_set():
        alive = vitals.alive()
        await health.update(alive, alive and vitals.ready())
        await _wait(stop, HEALTH_PERIOD_S)


async def _keep_pinging(stop: asyncio.Event, vitals: Vitals, notifier: Notifier) -> None:
    """WATCHDOG=1 every half WatchdogSec while the daemon is alive: a wedged one is restarted."""
    period = notifier.watchdog_period
    while period is not None and not stop.is_set():
        if vitals.alive():
            notifier.watchdog()
        else:
            log.warning("the daemon's loop has not turned for %.0fs; not telling systemd it is "
                        "alive", time.monotonic() - vitals.heartbeat())
        await _wait(stop, period)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
