"""Who may read the web view (coordinator process): whoever gRPC Status would serve.

When the coordinator has any token, a request must carry one that may call Status (the reader's
or the control's; `--token-file` gives one to each role without its own): `Authorization: Bearer
<token>` (scripts), or the session cookie the login form sets once that token was typed into it
(browsers). The cookie holds its expiry and an HMAC of it keyed by the token, not the token: it
opens the web view and nothing else (the gRPC service does not take it), lasts SESSION_S, and
changing the token ends every session. Without any token the view listens on loopback only,
answers only requests addressed to a loopback name (so a web page elsewhere cannot reach it
through DNS rebinding), and serves only root and the coordinator's own user (`peers`).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from http.cookies import CookieError, SimpleCookie
from typing import Any

from watchdog.errors import UsageError
from watchdog.transport.auth import is_loopback
from watchdog.transport.peers import endpoint, local_caller_refusal
from watchdog.transport.roles import STATUS, Role, allowed_roles

COOKIE = "watchdog_session"
SESSION_S = 8 * 3600  # a working day: a browser left signed in is signed out by the next
_SESSION_LABEL = b"torch-hang-watchdog web session v2|"
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class WebAuth:
    def __init__(self, tokens: Mapping[Role, str], listen: str,
                 clock: Callable[[], float] = time.time) -> None:
        """`tokens`: the coordinator's, by role (`roles.role_tokens`)."""
        readers = {token for role, token in tokens.items() if role in allowed_roles(STATUS)}
        if tokens and not readers:
            raise UsageError("the web view opens with a token that may read (Status), and this "
                             "coordinator has none", hint="give it --reader-token-file")
        if not tokens and not is_loopback(listen):
            raise UsageError(f"the web view would serve every job to anyone who reaches {listen}",
                             hint="give the coordinator a token (--token-file), or listen on "
                                  "127.0.0.1")
        self._tokens = sorted(token.encode() for token in readers)
        self._clock = clock
        self._hosts = {_host_name(listen.rpartition(":")[0]), *_LOOPBACK_NAMES}

    @property
    def required(self) -> bool:
        return bool(self._tokens)

    def host_allowed(self, host_header: str | None) -> bool:
        """Without a token, only requests addressed to the loopback name we listen on."""
        if self.required:
            return True
        return _host_name(host_header or "") in self._hosts

    def peer_refusal(self, client_address: Any, server_port: int) -> str:
        """Without a token, why the client at `client_address` (as the socket names it) may
        not read; "" when it may, and always with a token (the token decides)."""
        if self.required:
            return ""
        try:
            caller = endpoint(client_address[0], client_address[1])
        except (ValueError, IndexError, TypeError):
            caller = None
        return local_caller_refusal(caller, server_port)

    def allows(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether a request with these headers may read (without a token: `peer_refusal`)."""
        if not self.required:
            return True
        presented = (authorization or "").encode()
        bearer = [hmac.compare_digest(presented, b"Bearer " + token) for token in self._tokens]
        return any(bearer) or self._session_valid(_cookie(cookie))

    def sign_in(self, typed: str, secure: bool) -> str | None:
        """The Set-Cookie value the login form answers a right token with; None for a wrong
        one."""
        presented = typed.strip().encode()
        matched = [token for token in self._tokens if hmac.compare_digest(presented, token)]
        if not matched:
            return None
        expires = str(int(self._clock()) + SESSION_S)
        flags = "; Secure" if secure else ""
        return (f"{COOKIE}={expires}.{_session_mac(matched[0], expires)}; Max-Age={SESSION_S}; "
                f"Path=/; HttpOnly; SameSite=Strict{flags}")

    def _session_valid(self, session: str | None) -> bool:
        expires, _, mac = (session or "").partition(".")
        if not (expires.isascii() and expires.isdigit()) or int(expires) <= self._clock():
            return False
        macs = [hmac.compare_digest(mac.encode(), _session_mac(token, expires).encode())
                for token in self._tokens]
        return any(macs)


def _session_mac(token: bytes, expires: str) -> str:
    return hmac.new(token, _SESSION_LABEL + expires.encode(), hashlib.sha256).hexdigest()


def _host_name(header: str) -> str:
    """'127.0.0.1:8080' -> '127.0.0.1', '[::1]:8080' -> '[::1]', 'localhost' -> 'localhost'."""
    host = header.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.split(":", 1)[0]


def _cookie(header: str | None) -> str | None:
    if not header:
        return None
    try:
        jar = SimpleCookie(header)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return None if morsel is None else morsel.value
