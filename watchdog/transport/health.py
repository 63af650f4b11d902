"""The standard gRPC health service (grpc.health.v1, from grpcio-health-checking) for the agent
and the coordinator processes: what Kubernetes' `grpc:` probes and grpc_health_probe ask.

Two service names: "" (the daemon as a whole: its loop runs and, for an agent, its stream to the
coordinator is up) and "liveness" (its loop runs). A probe that restarts the daemon should ask
"liveness": an agent restarted because its coordinator is down would not bring it back. The
service answers without a token: it tells a caller nothing but SERVING or NOT_SERVING.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health as _health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from watchdog.errors import UsageError
from watchdog.transport.auth import Handler

SERVICE = _health.SERVICE_NAME
OVERALL = _health.OVERALL_HEALTH
LIVENESS = "liveness"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """One daemon's health, as the standard service reports it; NOT_SERVING until `update`
    says otherwise (the servicer itself starts out SERVING)."""

    def __init__(self) -> None:
        self.servicer = _health.aio.HealthServicer()

    @classmethod
    async def create(cls) -> Health:
        health = cls()
        await health.update(alive=False, ready=False)
        return health

    async def update(self, alive: bool, ready: bool) -> None:
        await self.servicer.set(LIVENESS, SERVING if alive else NOT_SERVING)
        await self.servicer.set(OVERALL, SERVING if alive and ready else NOT_SERVING)

    async def shutdown(self) -> None:
        """NOT_SERVING for good: the daemon is stopping."""
        await self.servicer.enter_graceful_shutdown()

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)


class OpenHealth(grpc.aio.ServerInterceptor):
    """Runs `check` (the token check) on every call except the health service's, which a kubelet
    probe makes without credentials."""

    def __init__(self, check: grpc.aio.ServerInterceptor) -> None:
        self._check = check

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
            details: grpc.HandlerCallDetails) -> Handler | None:
        method: Any = details.method
        if isinstance(method, str) and method.startswith(f"/{SERVICE}/"):
            return await continuation(details)
        return await self._check.intercept_service(continuation, details)


async def start_health_server(address: str, health: Health) -> tuple[grpc.aio.Server, int]:
    """A plaintext server on `address` with the health service alone: for probes of an agent,
    or of a coordinator whose own port speaks TLS (kubelet probes do not)."""
    server = grpc.aio.server()
    health.add_to(server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:  # what grpc raises when it cannot bind
        port = 0
    if port == 0:
        raise UsageError(f"cannot serve health checks on {address}",
                         hint="is another process using that port?")
    await server.start()
    return server, port
