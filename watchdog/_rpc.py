"""gRPC transport (grpc.aio) between agents, coordinator and `watchdog status`.

Messages cross this module only as `_model` dataclasses: `_wire` converts at the boundary, and a
message that fails validation is logged and dropped without ending the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from watchdog import _wire
from watchdog._errors import CoordinatorUnreachableError, MessageRejectedError
from watchdog._model import NodeReport, StackReply, StackRequest
from watchdog._proto import watchdog_pb2 as pb
from watchdog._proto import watchdog_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

DEFAULT_PORT = 29450
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", _wire.MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _wire.MAX_MESSAGE_BYTES),
]

AgentMessage = NodeReport | StackReply


SESSION_OUTBOX = 64


@dataclass(eq=False)
class AgentSession:
    """The coordinator's side of one connected agent."""

    peer: str
    node: str = ""  # known from its first report
    outbox: asyncio.Queue[StackRequest] = field(
        default_factory=lambda: asyncio.Queue(SESSION_OUTBOX))


class CoordinatorHandler(Protocol):
    def open_session(self, peer: str) -> AgentSession: ...

    def close_session(self, session: AgentSession) -> None: ...

    def on_message(self, session: AgentSession, message: AgentMessage) -> None: ...

    def status_json(self, job_id: str) -> str: ...


class _Servicer(pb_grpc.CoordinatorServicer):
    def __init__(self, handler: CoordinatorHandler) -> None:
        self._handler = handler

    async def Connect(
        self, request_iterator: AsyncIterator[pb.AgentMessage],
        context: grpc.aio.ServicerContext[pb.AgentMessage, pb.CoordinatorMessage],
    ) -> AsyncIterator[pb.CoordinatorMessage]:
        session = self._handler.open_session(context.peer())
        reader = asyncio.create_task(self._read(request_iterator, session))
        try:
            while not reader.done():
                request = asyncio.create_task(session.outbox.get())
                await asyncio.wait({request, reader}, return_when=asyncio.FIRST_COMPLETED)
                if request.done():
                    yield _wire.stack_request_to_pb(request.result())
                else:
                    request.cancel()
        finally:
            reader.cancel()
            self._handler.close_session(session)

    async def _read(self, messages: AsyncIterator[pb.AgentMessage], session: AgentSession) -> None:
        async for message in messages:
            try:
                self._handler.on_message(session, _wire.agent_message_from_pb(message))
            except MessageRejectedError as e:
                log.warning("rejected a message from an agent: %s", e)

    async def Status(
        self, request: pb.StatusRequest,
        context: grpc.aio.ServicerContext[pb.StatusRequest, pb.StatusReply],
    ) -> pb.StatusReply:
        try:
            job_id = _wire.status_request_from_pb(request)
        except MessageRejectedError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return _wire.status_reply_to_pb(self._handler.status_json(job_id))


async def start_server(handler: CoordinatorHandler, address: str) -> tuple[grpc.aio.Server, int]:
    """Serve on `address` (HOST:PORT, or unix:PATH); returns the server and the bound port."""
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    pb_grpc.add_CoordinatorServicer_to_server(_Servicer(handler), server)
    port = server.add_insecure_port(address)
    if port == 0 and not address.startswith("unix:"):
        raise CoordinatorUnreachableError(f"cannot listen on {address}",
                                          hint="is another coordinator using that port?")
    await server.start()
    return server, port


class CoordinatorClient:
    """An agent's or a CLI's connection to one coordinator."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.CoordinatorStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def status_json(self, job_id: str = "", timeout: float = 10.0) -> str:
        try:
            reply = await self._stub.Status(_wire.status_request_to_pb(job_id), timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise CoordinatorUnreachableError(
                f"coordinator at {self.address}: {e.details() or e.code().name}") from e
        return _wire.status_reply_from_pb(reply)

    async def connect(self, outgoing: AsyncIterator[AgentMessage]) -> AsyncIterator[StackRequest]:
        """Stream `outgoing` to the coordinator; yields the requests it sends back."""
        call = self._stub.Connect(_agent_messages_to_pb(outgoing))
        async for message in call:
            try:
                request = _wire.coordinator_message_from_pb(message)
            except MessageRejectedError as e:
                log.warning("rejected a message from the coordinator: %s", e)
                continue
            if request is not None:
                yield request


async def _agent_messages_to_pb(
        outgoing: AsyncIterator[AgentMessage]) -> AsyncIterator[pb.AgentMessage]:
    async for item in outgoing:
        yield _wire.report_to_pb(item) if isinstance(item, NodeReport) else _wire.stacks_to_pb(item)
