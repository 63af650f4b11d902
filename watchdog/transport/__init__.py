"""gRPC between agents, the coordinator and `watchdog status` (agent, coordinator and CLI
processes): the services, the one adapter from protobuf messages to dataclasses (`wire`), tokens
and TLS (`auth`), the standard health service (`health`). Only this package sees the generated
code in `proto/`."""

from watchdog.transport.auth import (
    ClientSecurity,
    ServerSecurity,
    client_security,
    server_security,
)
from watchdog.transport.health import Health, start_health_server
from watchdog.transport.rpc import (
    AgentMessage,
    AgentSession,
    CoordinatorClient,
    start_server,
)

__all__ = [
    "AgentMessage", "AgentSession", "ClientSecurity", "CoordinatorClient", "Health",
    "ServerSecurity", "client_security", "server_security", "start_health_server",
    "start_server",
]
