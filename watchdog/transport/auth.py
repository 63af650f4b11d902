"""Tokens and TLS for the gRPC transport (coordinator, agent and `watchdog status` processes).

A token is a secret shared by the coordinator and its clients; every call carries it as
`authorization: Bearer <token>` metadata, and the coordinator refuses a call without the right
one before it parses a byte of the request (`roles`: which token may call what). TLS is
optional; unix sockets never use it (they are 0600 files).
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import grpc

from watchdog.errors import UsageError

TOKEN_ENV = "WATCHDOG_TOKEN"
TOKEN_HEADER = "authorization"
REFUSED = "missing or wrong token: pass --token-file"
_CHMOD_HINT = "chmod 600 {path}"
_MAKE_TOKEN_HINT = "use e.g. `openssl rand -hex 32` to make a token"
_TOKEN_HINT = ("pass the file that holds the token, readable by this user (e.g. `openssl rand "
               "-hex 32 > {path} && chmod 600 {path}` makes one)")
_PEM_HINT = "pass a PEM file (-----BEGIN ...-----), e.g. as written by openssl"

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ServerSecurity:
    """What the coordinator demands: tokens (`token` for every role that has none of its own
    in `role_tokens`; none at all: callers on this machine only, see `roles`) and TLS (None:
    plaintext)."""

    token: str | None = None
    credentials: grpc.ServerCredentials | None = None
    role_tokens: Mapping[str, str] = field(default_factory=dict)  # role name -> its token

    def tokens(self, roles: Iterable[str]) -> dict[str, str]:
        """Each of `roles` that has a token, with it."""
        chosen = {role: self.role_tokens.get(role, self.token) for role in roles}
        return {role: token for role, token in chosen.items() if token}


@dataclass(frozen=True)
class ClientSecurity:
    """What an agent or `watchdog status` presents: a token and TLS (None: plaintext)."""

    token: str | None = None
    credentials: grpc.ChannelCredentials | None = None

    def metadata(self) -> Metadata | None:
        return ((TOKEN_HEADER, f"Bearer {self.token}"),) if self.token else None


def server_security(token_file: str | None, cert: str | None, key: str | None,
                    client_ca: str | None,
                    role_token_files: Mapping[str, str | None] | None = None) -> ServerSecurity:
    """From the coordinator's --token-file, --tls-cert, --tls-key, --tls-client-ca and the
    token file of each role (--agent-token-file, ...)."""
    if (cert is None) != (key is None) or (client_ca is not None and cert is None):
        raise UsageError("TLS needs both --tls-cert and --tls-key (and --tls-client-ca needs them)")
    token = load_token(token_file)
    role_tokens = {role: _load_file_token(path)
                   for role, path in (role_token_files or {}).items() if path is not None}
    if cert is None or key is None:
        return ServerSecurity(token, role_tokens=role_tokens)
    chain, private_key = _read_key_pair(cert, key)
    ca = None if client_ca is None else _read_certificates(client_ca, "client CA certificate")
    return ServerSecurity(token, grpc.ssl_server_credentials(
        [(private_key, chain)], root_certificates=ca, require_client_auth=ca is not None),
        role_tokens)


def client_security(token_file: str | None, ca: str | None, cert: str | None,
                    key: str | None) -> ClientSecurity:
    """From an agent's or `watchdog status`'s --token-file, --tls-ca, --tls-cert and --tls-key."""
    if (cert is None) != (key is None) or (cert is not None and ca is None):
        raise UsageError("a client certificate needs --tls-cert, --tls-key and --tls-ca")
    token = load_token(token_file)
    if ca is None:
        return ClientSecurity(token)
    chain, private_key = _read_key_pair(cert, key) if cert and key else (None, None)
    return ClientSecurity(token, grpc.ssl_channel_credentials(
        _read_certificates(ca, "CA certificate"), private_key, chain))


def load_token(path: str | None) -> str | None:
    """The token in the file at `path`, else in $WATCHDOG_TOKEN, else None (no token)."""
    if path is None:
        value = os.environ.get(TOKEN_ENV)
        return None if value is None else _check_token(value, f"${TOKEN_ENV}")
    return _load_file_token(path)


def _load_file_token(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
        if mode & stat.S_IRWXO:
            raise UsageError(f"token file {path} is accessible to every user ({mode & 0o777:o})",
                             hint=_CHMOD_HINT.format(path=path))
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"cannot read token file {path}: {e.strerror}",
                         hint=_TOKEN_HINT.format(path=path)) from e
    return _check_token(text, f"token file {path}")


def _check_token(text: str, source: str) -> str:
    token = text.strip()
    if not token:
        raise UsageError(f"{source} is empty", hint=_MAKE_TOKEN_HINT)
    # gRPC metadata values are printable ASCII; anything else would fail on every call.
    if not all(" " <= c <= "~" for c in token):
        raise UsageError(f"{source} holds characters other than printable ASCII",
                         hint=_MAKE_TOKEN_HINT)
    return token


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}", hint=_PEM_HINT) from e
    if b"-----BEGIN " not in data:
        raise UsageError(f"{what} {path} is not a PEM file", hint=_PEM_HINT)
    return data


def _read_key_pair(cert: str, key: str) -> tuple[bytes, bytes]:
    """Certificate chain and private key, checked to parse and to belong together."""
    chain, private_key = _read_certificates(cert, "certificate"), _read(key, "key")

    def no_password() -> bytes:  # else OpenSSL would prompt for one on the terminal
        raise UsageError(f"key {key} is encrypted; gRPC needs it unencrypted",
                         hint=f"`openssl pkey -in {key} -out PLAIN.key`, then chmod 600 it")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, no_password)
    except ssl.SSLError as e:
        raise UsageError(f"key {key} does not go with certificate {cert}: {e.reason or e}",
                         hint="pass the certificate's own private key, PEM, unencrypted") from e
    return chain, private_key


def _read_certificates(path: str, what: str) -> bytes:
    data = _read(path, what)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError) as e:
        raise UsageError(f"{what} {path} does not parse: {e}", hint=_PEM_HINT) from e
    return data


def is_loopback(address: str) -> bool:
    """Whether a HOST:PORT listen address (or unix:PATH) is reachable from this machine only."""
    if address.startswith("unix:"):
        return True
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic in the stubs only
