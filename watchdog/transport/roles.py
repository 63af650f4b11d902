"""Who may call what on the coordinator (coordinator process): a credential per role, checked
on every call before a byte of it is parsed.

| role | may call | its token |
| --- | --- | --- |
| agent | Connect: stream node reports, answer stack requests | --agent-token-file |
| reader | Status: every job, rank, stack and log line | --reader-token-file |
| control | Status, and every other method (those that act on jobs) | --control-token-file |

`--token-file` gives one token to every role that has none of its own. A call whose token
matches no role gets UNAUTHENTICATED; one whose role may not call the method gets
PERMISSION_DENIED. Without any token the coordinator serves callers on this machine only: a unix
socket (its file mode decides), or loopback TCP from root or the coordinator's own user (the
owner of the caller's live connection to the guarded port, from the kernel: `peers`); everyone
else gets PERMISSION_DENIED.
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from watchdog.transport.auth import REFUSED, TOKEN_HEADER, Handler, ServerSecurity
from watchdog.transport.peers import local_caller_refusal, parse_peer
from watchdog.transport.proto import watchdog_pb2 as pb

log = logging.getLogger(__name__)

_SERVICE = f"/{pb.DESCRIPTOR.package}.Coordinator"
CONNECT = f"{_SERVICE}/Connect"
STATUS = f"{_SERVICE}/Status"
Context = grpc.aio.ServicerContext[Any, Any]


class Role(enum.Enum):
    AGENT = "agent"
    READER = "reader"
    CONTROL = "control"


METHOD_ROLES: Mapping[str, frozenset[Role]] = {
    CONNECT: frozenset({Role.AGENT}),
    STATUS: frozenset({Role.READER, Role.CONTROL}),
}
OTHER_METHODS = frozenset({Role.CONTROL})


def allowed_roles(method: str) -> frozenset[Role]:
    return METHOD_ROLES.get(method, OTHER_METHODS)


def role_tokens(security: ServerSecurity) -> dict[Role, str]:
    """Each role that has a token, with it (`--token-file`'s for every role without its own)."""
    return {Role(role): token for role, token in security.tokens(r.value for r in Role).items()}


def _presented(metadata: Any) -> bytes:
    value = next((v for k, v in metadata or () if k == TOKEN_HEADER), b"")
    return value.encode() if isinstance(value, str) else bytes(value)


class Guard(grpc.aio.ServerInterceptor):
    """Refuses every call its credential does not allow (see the module's doc)."""

    def __init__(self, tokens: Mapping[Role, str]) -> None:
        self._expected = {role: f"Bearer {token}".encode() for role, token in tokens.items()}
        self.port = 0  # the TCP port it guards, set once bound: callers are looked up by it

    def roles(self, metadata: Any) -> frozenset[Role]:
        """The roles the call's token stands for (every comparison runs: constant time)."""
        presented = _presented(metadata)
        matches = {role: hmac.compare_digest(presented, expected)
                   for role, expected in self._expected.items()}
        return frozenset(role for role, match in matches.items() if match)

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
            details: grpc.HandlerCallDetails) -> Handler | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        if not self._expected:
            return _checked(handler, self._local_caller_refusal)
        roles = self.roles(details.invocation_metadata)
        if not roles:
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED, REFUSED, method)
        if not roles & allowed_roles(method):
            names = " and ".join(sorted(role.value for role in roles))
            needed = " or ".join(sorted(role.value for role in allowed_roles(method)))
            return _refusing(handler, grpc.StatusCode.PERMISSION_DENIED,
                             f"the {names} token may not call {method.rsplit('/', 1)[-1]}: "
                             f"pass the {needed} token", method)
        return handler

    async def _local_caller_refusal(self, context: Context) -> str:
        """Why a caller may not use a coordinator that has no token; "" when it may."""
        peer = context.peer()
        if peer.startswith("unix:"):
            return ""  # the socket's file mode already decided
        return await asyncio.to_thread(local_caller_refusal, parse_peer(peer), self.port)


def _refusing(handler: Handler, code: grpc.StatusCode, message: str, method: str) -> Handler:
    async def refuse(context: Context) -> str:
        log.warning("refused %s from %s: %s", method, context.peer(), message)
        await context.abort(code, message)
        return message  # not reached: abort raises

    return _checked(handler, refuse)


def _checked(handler: Handler, refusal: Callable[[Context], Awaitable[str]]) -> Handler:
    """`handler`, behind `refusal`: a call it names a reason for is ended PERMISSION_DENIED."""
    unary: Any = handler.unary_unary
    stream: Any = handler.stream_stream

    async def check(context: Context) -> None:
        reason = await refusal(context)
        if reason:
            log.warning("refused a call from %s: %s", context.peer(), reason)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)

    async def unary_call(request: Any, context: Context) -> Any:
        await check(context)
        return await unary(request, context)

    async def stream_call(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
        await check(context)
        async for reply in stream(requests, context):
            yield reply

    if unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            unary_call, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    if stream is not None:
        return grpc.stream_stream_rpc_method_handler(
            stream_call, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    raise TypeError(f"no guard for a handler of this kind: {handler}")


def certificate_names(context: Context) -> frozenset[str] | None:
    """The names a client certificate vouches for (its subject alternative names and common
    name), or None when the caller presented none."""
    auth = context.auth_context()
    names = [*auth.get("x509_subject_alternative_name", ()), *auth.get("x509_common_name", ())]
    if not names:
        return None
    return frozenset(n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n)
                     for n in names)
