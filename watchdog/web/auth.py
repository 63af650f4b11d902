"""Who may read the web view (coordinator process).

With a token configured, a request must carry it: `Authorization: Bearer <token>` (scripts), or
the session cookie the login form sets once the token was typed into it (browsers). The cookie
holds an HMAC of the token, not the token: it opens the web view and nothing else (the gRPC
service does not take it), and changing the token ends every session. Without a token the view
listens on loopback only and answers only requests addressed to a loopback name, so a web page
elsewhere cannot reach it through DNS rebinding.
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import CookieError, SimpleCookie

from watchdog.errors import UsageError
from watchdog.transport.auth import is_loopback

COOKIE = "watchdog_session"
_SESSION_LABEL = b"torch-hang-watchdog web session v1"
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class WebAuth:
    def __init__(self, token: str | None, listen: str) -> None:
        if token is None and not is_loopback(listen):
            raise UsageError(f"the web view would serve every job to anyone who reaches {listen}",
                             hint="give the coordinator a token (--token-file), or listen on "
                                  "127.0.0.1")
        self._bearer = None if token is None else f"Bearer {token}".encode()
        self._token = None if token is None else token.encode()
        self._session = None if token is None else hmac.new(
            token.encode(), _SESSION_LABEL, hashlib.sha256).hexdigest().encode()
        self._hosts = {_host_name(listen.rpartition(":")[0]), *_LOOPBACK_NAMES}

    @property
    def required(self) -> bool:
        return self._token is not None

    def host_allowed(self, host_header: str | None) -> bool:
        """Without a token, only requests addressed to the loopback name we listen on."""
        if self.required:
            return True
        return _host_name(host_header or "") in self._hosts

    def allows(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether a request with these headers may read."""
        if self._token is None:
            return True
        if authorization is not None and hmac.compare_digest(authorization.encode(),
                                                             self._bearer or b""):
            return True
        session = _cookie(cookie)
        return session is not None and hmac.compare_digest(session.encode(), self._session or b"")

    def check_token(self, typed: str) -> bool:
        return self._token is not None and hmac.compare_digest(typed.strip().encode(),
                                                               self._token)

    def session_cookie(self, secure: bool) -> str:
        """The Set-Cookie value the login form answers with."""
        assert self._session is not None
        flags = "; Secure" if secure else ""
        return f"{COOKIE}={self._session.decode()}; Path=/; HttpOnly; SameSite=Strict{flags}"


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
