"""gRPC transport (grpc.aio) between agents, coordinator and `watchdog status`.

Messages cross this module only as `model` dataclasses: `wire` converts at the boundary, and a
message that fails validation is logged and dropped without ending the stream. Bytes that are not
a protobuf message at all end their call with INVALID_ARGUMENT. Tokens and TLS: `auth`; which
credential may call which method: `roles`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from watchdog.errors import (
    AuthError,
    CoordinatorUnreachableError,
    MessageRejectedError,
    UsageError,
)
from watchdog.model import EVERY_JOB, NodeReport, StackReply, StackRequest, StatusQuery
from watchdog.transport import wire as _wire
from watchdog.transport.auth import ClientSecurity, Handler, ServerSecurity, is_loopback
from watchdog.transport.health import Health, OpenHealth
from watchdog.transport.limits import MAX_MESSAGE_BYTES
from watchdog.transport.proto import watchdog_pb2 as pb
from watchdog.transport.proto import watchdog_pb2_grpc as pb_grpc
from watchdog.transport.roles import Guard, certificate_names, role_tokens

log = logging.getLogger(__name__)

# Both ends, the coordinator's server included, refuse a message over MAX_MESSAGE_BYTES (16 MiB):
# the call ends with RESOURCE_EXHAUSTED and the message is never parsed. Stated rather than left
# to gRPC's defaults (4 MiB received, no limit sent): a report of many ranks with stacks can
# pass 4 MiB.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]

AgentMessage = NodeReport | StackReply
Context = grpc.aio.ServicerContext[Any, Any]
NOT_A_MESSAGE = "not a protobuf message of the expected type"
# Sent by Connect before anything else: the call got past the token check.
ACCEPTED_KEY = "watchdog-accepted"
REFUSED_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


SESSION_OUTBOX = 64


@dataclass(eq=False)
class AgentSession:
    """The coordinator's side of one connected agent."""

    peer: str
    names: frozenset[str] | None = None  # what its client certificate vouches for, if any
    node: str = ""  # known from its first report
    outbox: asyncio.Queue[StackRequest] = field(
        default_factory=lambda: asyncio.Queue(SESSION_OUTBOX))


class CoordinatorHandler(Protocol):
    def open_session(self, peer: str, names: frozenset[str] | None) -> AgentSession: ...

    def close_session(self, session: AgentSession) -> None: ...

    def on_message(self, session: AgentSession, message: AgentMessage) -> None: ...

    def status_json(self, query: StatusQuery) -> str: ...


class _Servicer(pb_grpc.CoordinatorServicer):
    def __init__(self, handler: CoordinatorHandler) -> None:
        self._handler = handler

    async def Connect(
        self, request_iterator: AsyncIterator[pb.AgentMessage],
        context: grpc.aio.ServicerContext[pb.AgentMessage, pb.CoordinatorMessage],
    ) -> AsyncIterator[pb.CoordinatorMessage]:
        await context.send_initial_metadata(((ACCEPTED_KEY, "1"),))
        session = self._handler.open_session(context.peer(), certificate_names(context))
        reader = asyncio.create_task(self._read(request_iterator, session))
        try:
            while not reader.done():
                request = asyncio.create_task(session.outbox.get())
                await asyncio.wait({request, reader}, return_when=asyncio.FIRST_COMPLETED)
                if request.done():
                    yield _wire.stack_request_to_pb(request.result())
                else:
                    request.cancel()
            await reader  # raises what ended the reading: an abort ends the call with its status
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
            query = _wire.status_request_from_pb(request)
        except MessageRejectedError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return _wire.status_reply_to_pb(self._handler.status_json(query))


class _RejectUnparsable(grpc.aio.ServerInterceptor):
    """A request that is not a protobuf message at all ends its call with INVALID_ARGUMENT and
    one log line, where gRPC would answer UNKNOWN and log a traceback."""

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
            details: grpc.HandlerCallDetails) -> Handler | None:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer
        unary: Any = handler.unary_unary
        stream: Any = handler.stream_stream

        async def unary_call(raw: bytes, context: Context) -> Any:
            return await unary(await _parse(parse, raw, context), context)

        async def stream_call(raws: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
            async for reply in stream(_parse_each(parse, raws, context), context):
                yield reply

        if unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                unary_call, response_serializer=handler.response_serializer)
        if stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                stream_call, response_serializer=handler.response_serializer)
        return handler


async def _parse(parse: Callable[[bytes], Any], raw: bytes, context: Context) -> Any:
    try:
        return parse(raw)
    except DecodeError:
        log.warning("rejected %d bytes from %s: not a protobuf message", len(raw), context.peer())
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NOT_A_MESSAGE)


async def _parse_each(parse: Callable[[bytes], Any], raws: AsyncIterator[bytes],
                      context: Context) -> AsyncIterator[Any]:
    async for raw in raws:
        yield await _parse(parse, raw, context)


async def start_server(handler: CoordinatorHandler, address: str,
                       security: ServerSecurity | None = None,
                       health: Health | None = None) -> tuple[grpc.aio.Server, int]:
    """Serve on `address` (HOST:PORT, or unix:PATH: plaintext whatever `security` says), with
    the standard health service too when given one; returns the server and the bound port."""
    security = security or ServerSecurity()
    tokens = role_tokens(security)
    if not tokens and not is_loopback(address):
        raise UsageError(f"listening on {address} without a token would let anyone who reaches "
                         "it read every job and send reports",
                         hint="pass --token-file (with --tls-cert/--tls-key across a network), "
                              "or listen on 127.0.0.1")
    # Credentials are checked first, so a caller without them never gets a byte parsed.
    # A kubelet probes health without credentials: that service alone is open.
    guard = Guard(tokens)
    interceptors: list[grpc.aio.ServerInterceptor] = [OpenHealth(guard), _RejectUnparsable()]
    # Without SO_REUSEPORT (grpc's default) a second coordinator on a taken port would start
    # and silently share the agents' connections with the first.
    server = grpc.aio.server(interceptors=interceptors,
                             options=[*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)])
    pb_grpc.add_CoordinatorServicer_to_server(_Servicer(handler), server)
    if health is not None:
        health.add_to(server)
    try:
        if security.credentials is None or address.startswith("unix:"):
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, security.credentials)
    except RuntimeError:  # what grpc raises when it cannot bind
        port = 0
    if port == 0 and not address.startswith("unix:"):
        raise CoordinatorUnreachableError(f"cannot listen on {address}",
                                          hint="is another coordinator using that port?")
    guard.port = port
    if not tokens and not address.startswith("unix:"):
        log.warning("listening on %s without a token: only root and uid %d on this machine may "
                    "call it; pass --token-file to serve other users or nodes", address,
                    os.geteuid())
    await server.start()
    return server, port


class CoordinatorClient:
    """An agent's or a CLI's connection to one coordinator."""

    def __init__(self, address: str, security: ClientSecurity | None = None) -> None:
        security = security or ClientSecurity()
        self.address = address
        self._metadata = security.metadata()
        if security.credentials is None or address.startswith("unix:"):
            self._tls_hint = "if it speaks TLS, pass --tls-ca (and --tls-cert/--tls-key)"
            self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        else:
            self._tls_hint = ("check that it speaks TLS, that --tls-ca signed its certificate "
                              "and, if it asks for one, --tls-cert/--tls-key")
            self._channel = grpc.aio.secure_channel(address, security.credentials,
                                                    options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.CoordinatorStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def status_json(self, query: StatusQuery = EVERY_JOB,
                          timeout: float = 10.0) -> str:
        try:
            reply = await self._stub.Status(_wire.status_request_to_pb(query), timeout=timeout,
                                            metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() in REFUSED_CODES:
                raise self._refused(e) from e
            raise CoordinatorUnreachableError(
                f"coordinator at {self.address}: {e.details() or e.code().name}",
                hint=f"{CoordinatorUnreachableError.hint}; {self._tls_hint}") from e
        return _wire.status_reply_from_pb(reply)

    async def connect(self, outgoing: AsyncIterator[AgentMessage]) -> AsyncIterator[StackRequest]:
        """Stream `outgoing` to the coordinator; yields the requests it sends back."""
        call = self._stub.Connect(metadata=self._metadata)
        writer: asyncio.Task[None] | None = None
        try:
            # A write racing the coordinator's refusal makes grpc.aio report INTERNAL in place of
            # the refusal (grpc/grpc#36066): nothing is written until the coordinator accepts.
            if (await call.initial_metadata()).get(ACCEPTED_KEY):
                writer = asyncio.create_task(_write_all(call, outgoing))
            async for message in call:
                try:
                    request = _wire.coordinator_message_from_pb(message)
                except MessageRejectedError as e:
                    log.warning("rejected a message from the coordinator: %s", e)
                    continue
                if request is not None:
                    yield request
        except grpc.aio.AioRpcError as e:
            if e.code() in REFUSED_CODES:
                raise self._refused(e) from e
            raise
        except asyncio.CancelledError:
            if writer is not None and writer.done() and not writer.cancelled():
                raise CoordinatorUnreachableError(
                    f"stream to {self.address} ended: {writer.exception()!r}") from None
            raise
        finally:
            if writer is not None:
                writer.cancel()

    def _refused(self, e: grpc.aio.AioRpcError) -> AuthError:
        return AuthError(f"coordinator at {self.address} refused the call: {e.details()}")


async def _write_all(call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.CoordinatorMessage],
                     outgoing: AsyncIterator[AgentMessage]) -> None:
    """Writes `outgoing` until it ends; anything but the call's own end cancels the call, so
    that its reader stops too."""
    try:
        async for item in outgoing:
            await call.write(_wire.report_to_pb(item) if isinstance(item, NodeReport)
                             else _wire.stacks_to_pb(item))
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        return  # the call has ended: its reader reports the status
    except BaseException:
        call.cancel()
        raise
