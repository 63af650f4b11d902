"""Who may read the web view: a token Status takes, as a bearer or through the session cookie
the login sets (which expires); without a token, loopback only and requests addressed to a
loopback name only (who the caller is: tests/security/test_peer_identity)."""

from __future__ import annotations

import pytest

from watchdog.errors import UsageError
from watchdog.transport.roles import Role
from watchdog.web.access import COOKIE, SESSION_S, WebAuth
from watchdog.web.server import local_path

TOKEN = "5b1e9c0d7a3f4e2b8c6d0a1f9e8d7c6b"
READER = {Role.READER: TOKEN}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_without_a_token_only_loopback_and_loopback_names() -> None:
    with pytest.raises(UsageError, match="--token-file"):
        WebAuth({}, "0.0.0.0:8080")
    auth = WebAuth({}, "127.0.0.1:8080")
    assert auth.allows(None, None)
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST"):
        assert auth.host_allowed(host), host
    for host in ("attacker.example:8080", "127.0.0.1.attacker.example", "", None):
        assert not auth.host_allowed(host), host


def test_with_a_token_the_bearer_or_the_session_cookie() -> None:
    auth = WebAuth(READER, "0.0.0.0:8080")
    assert auth.host_allowed("coordinator.example:8080")
    assert auth.peer_refusal(("10.1.2.3", 5000), 8080) == ""  # the token decides
    assert not auth.allows(None, None)
    assert auth.allows(f"Bearer {TOKEN}", None)
    assert not auth.allows(f"Bearer {TOKEN}x", None)
    assert not auth.allows(TOKEN, None)
    cookie = auth.sign_in(f" {TOKEN}\n", secure=True)
    assert cookie is not None and auth.sign_in(TOKEN[:-1], secure=True) is None
    session = cookie.split(";")[0]
    assert session.startswith(f"{COOKIE}=") and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" in cookie
    assert f"Max-Age={SESSION_S}" in cookie
    assert "Secure" not in str(auth.sign_in(TOKEN, secure=False))
    assert auth.allows(None, f"theme=dark; {session}")
    forged = session[:-1] + ("1" if session.endswith("0") else "0")
    assert not auth.allows(None, forged)
    assert not auth.allows(None, f"{COOKIE}={TOKEN}")  # the token itself is not a session
    assert not auth.allows(None, 'bad"cookie;;=')


def test_a_session_ends_after_its_lifetime_and_cannot_be_stretched() -> None:
    clock = Clock()
    auth = WebAuth(READER, "127.0.0.1:8080", clock=clock)
    session = str(auth.sign_in(TOKEN, secure=False)).split(";")[0]
    expires, mac = session.removeprefix(f"{COOKIE}=").split(".")
    clock.now += SESSION_S - 1
    assert auth.allows(None, session)
    clock.now += 1
    assert not auth.allows(None, session)
    stretched = f"{COOKIE}={int(expires) + SESSION_S}.{mac}"
    assert not auth.allows(None, stretched)


def test_the_token_of_any_role_that_may_read_opens_it() -> None:
    both = WebAuth({Role.AGENT: "agent-token", Role.CONTROL: TOKEN}, "0.0.0.0:8080")
    assert both.required and both.allows(f"Bearer {TOKEN}", None)
    assert not both.allows("Bearer agent-token", None)
    assert both.sign_in("agent-token", secure=False) is None
    with pytest.raises(UsageError, match="--reader-token-file"):
        WebAuth({Role.AGENT: "agent-token"}, "127.0.0.1:8080")


def test_a_new_token_ends_every_session() -> None:
    old = str(WebAuth(READER, "127.0.0.1:1").sign_in(TOKEN, secure=False)).split(";")[0]
    assert not WebAuth({Role.READER: TOKEN[::-1]}, "127.0.0.1:1").allows(None, old)


def test_after_signing_in_readers_go_back_to_this_site_only() -> None:
    assert local_path("/jobs/a%2Fb?x=1") == "/jobs/a%2Fb?x=1"
    for elsewhere in ("//attacker.example/", "/\\attacker.example", "https://attacker.example/",
                      "jobs", "", "/\r\nSet-Cookie: x=1", "/jobs/\u00e9"):
        assert local_path(elsewhere) == "/", elsewhere
