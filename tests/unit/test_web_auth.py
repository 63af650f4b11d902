"""Who may read the web view: the token as a bearer, the session cookie the login sets, and
without a token, loopback only and requests addressed to a loopback name only."""

from __future__ import annotations

import pytest

from watchdog.errors import UsageError
from watchdog.web.auth import COOKIE, WebAuth
from watchdog.web.server import local_path

TOKEN = "5b1e9c0d7a3f4e2b8c6d0a1f9e8d7c6b"


def test_without_a_token_only_loopback_and_loopback_names() -> None:
    with pytest.raises(UsageError, match="--token-file"):
        WebAuth(None, "0.0.0.0:8080")
    auth = WebAuth(None, "127.0.0.1:8080")
    assert auth.allows(None, None)
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST"):
        assert auth.host_allowed(host), host
    for host in ("attacker.example:8080", "127.0.0.1.attacker.example", "", None):
        assert not auth.host_allowed(host), host


def test_with_a_token_the_bearer_or_the_session_cookie() -> None:
    auth = WebAuth(TOKEN, "0.0.0.0:8080")
    assert auth.host_allowed("coordinator.example:8080")
    assert not auth.allows(None, None)
    assert auth.allows(f"Bearer {TOKEN}", None)
    assert not auth.allows(f"Bearer {TOKEN}x", None)
    assert not auth.allows(TOKEN, None)
    cookie = auth.session_cookie(secure=True)
    session = cookie.split(";")[0]
    assert session.startswith(f"{COOKIE}=") and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" in cookie
    assert "Secure" not in auth.session_cookie(secure=False)
    assert auth.allows(None, f"theme=dark; {session}")
    assert not auth.allows(None, session[:-1] + "0")
    assert not auth.allows(None, f"{COOKIE}={TOKEN}")  # the token itself is not a session
    assert not auth.allows(None, 'bad"cookie;;=')
    assert auth.check_token(f" {TOKEN}\n") and not auth.check_token(TOKEN[:-1])


def test_a_new_token_ends_every_session() -> None:
    old = WebAuth(TOKEN, "127.0.0.1:1").session_cookie(secure=False).split(";")[0]
    assert not WebAuth(TOKEN[::-1], "127.0.0.1:1").allows(None, old)


def test_after_signing_in_readers_go_back_to_this_site_only() -> None:
    assert local_path("/jobs/a%2Fb?x=1") == "/jobs/a%2Fb?x=1"
    for elsewhere in ("//attacker.example/", "/\\attacker.example", "https://attacker.example/",
                      "jobs", "", "/\r\nSet-Cookie: x=1", "/jobs/\u00e9"):
        assert local_path(elsewhere) == "/", elsewhere
