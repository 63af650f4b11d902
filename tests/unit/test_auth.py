"""Token loading, the token comparison, security flag combinations and loopback detection."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.errors import UsageError
from watchdog.transport.auth import (
    TOKEN_ENV,
    TOKEN_HEADER,
    ClientSecurity,
    ServerSecurity,
    client_security,
    is_loopback,
    load_token,
    server_security,
)
from watchdog.transport.roles import CONNECT, STATUS, Guard, Role, allowed_roles


def _token_file(tmp_path: Path, text: str, mode: int = 0o600) -> str:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_token_file_is_read_and_stripped(tmp_path: Path) -> None:
    assert load_token(_token_file(tmp_path, "s3cret-token\n")) == "s3cret-token"


@pytest.mark.parametrize("mode", [0o604, 0o644, 0o666, 0o601])
def test_token_file_open_to_every_user_is_refused(tmp_path: Path, mode: int) -> None:
    path = _token_file(tmp_path, "s3cret-token", mode)
    with pytest.raises(UsageError) as refused:
        load_token(path)
    assert "accessible to every user" in str(refused.value)
    assert f"chmod 600 {path}" in str(refused.value)


def test_token_file_for_owner_and_group_is_accepted(tmp_path: Path) -> None:
    assert load_token(_token_file(tmp_path, "s3cret-token", 0o640)) == "s3cret-token"


@pytest.mark.parametrize(("text", "complaint"), [
    ("", "is empty"), (" \n", "is empty"), ("tok\x00en", "printable ASCII"),
    ("tökén", "printable ASCII")])
def test_unusable_token_file_is_refused(tmp_path: Path, text: str, complaint: str) -> None:
    path = _token_file(tmp_path, text)
    with pytest.raises(UsageError, match=complaint) as refused:
        load_token(path)
    assert path in str(refused.value)


def test_missing_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"cannot read token file {tmp_path}/nope"):
        load_token(str(tmp_path / "nope"))


def test_token_comes_from_the_environment_without_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "from-env\n")
    assert load_token(None) == "from-env"
    assert load_token(_token_file(tmp_path, "from-file")) == "from-file"  # the flag wins
    monkeypatch.setenv(TOKEN_ENV, "")
    with pytest.raises(UsageError, match=r"\$WATCHDOG_TOKEN is empty"):
        load_token(None)
    monkeypatch.delenv(TOKEN_ENV)
    assert load_token(None) is None


def test_client_sends_the_token_as_bearer_metadata() -> None:
    assert ClientSecurity("abc").metadata() == ((TOKEN_HEADER, "Bearer abc"),)
    assert ClientSecurity().metadata() is None


@pytest.mark.parametrize(("metadata", "accepted"), [
    (((TOKEN_HEADER, "Bearer right-token"),), True),
    ((("x-other", "1"), (TOKEN_HEADER, "Bearer right-token")), True),
    (((TOKEN_HEADER, b"Bearer right-token"),), True),
    (((TOKEN_HEADER, "Bearer wrong-token"),), False),
    (((TOKEN_HEADER, "Bearer right-token2"),), False),
    (((TOKEN_HEADER, "Bearer right-toke"),), False),
    (((TOKEN_HEADER, "right-token"),), False),
    ((("x-token", "Bearer right-token"),), False),
    ((), False),
    (None, False),
])
def test_token_check_accepts_only_the_exact_token(metadata: object, accepted: bool) -> None:
    assert Guard({Role.READER: "right-token"}).roles(metadata) == (
        {Role.READER} if accepted else set())


def test_each_token_stands_for_its_roles() -> None:
    guard = Guard({Role.AGENT: "agent-token", Role.READER: "reader-token",
                   Role.CONTROL: "reader-token"})
    assert guard.roles(((TOKEN_HEADER, "Bearer agent-token"),)) == {Role.AGENT}
    assert guard.roles(((TOKEN_HEADER, "Bearer reader-token"),)) == {Role.READER, Role.CONTROL}
    assert allowed_roles(CONNECT) == {Role.AGENT}
    assert allowed_roles(STATUS) == {Role.READER, Role.CONTROL}
    assert allowed_roles("/torch_hang_watchdog.v1.Coordinator/Kill") == {Role.CONTROL}


def test_the_shared_token_serves_every_role_without_one_of_its_own(tmp_path: Path) -> None:
    reader = tmp_path / "reader"
    reader.write_text("reader-token")
    reader.chmod(0o600)
    roles = ("agent", "reader", "control")
    assert ServerSecurity("shared").tokens(roles) == dict.fromkeys(roles, "shared")
    security = server_security(_token_file(tmp_path, "shared"), None, None, None,
                               {"reader": str(reader), "agent": None})
    assert security.tokens(roles) == {"agent": "shared", "reader": "reader-token",
                                      "control": "shared"}
    alone = server_security(None, None, None, None, {"agent": str(reader)})
    assert alone.tokens(roles) == {"agent": "reader-token"}  # no reader or control token


@pytest.mark.parametrize(("cert", "key", "ca"), [
    ("c.pem", None, None), (None, "k.pem", None), (None, None, "ca.pem")])
def test_server_tls_needs_certificate_and_key(
        cert: str | None, key: str | None, ca: str | None) -> None:
    with pytest.raises(UsageError, match="--tls-cert and --tls-key"):
        server_security(None, cert, key, ca)


@pytest.mark.parametrize(("ca", "cert", "key"), [
    (None, "c.pem", "k.pem"), ("ca.pem", "c.pem", None), ("ca.pem", None, "k.pem")])
def test_client_certificate_needs_key_and_ca(
        ca: str | None, cert: str | None, key: str | None) -> None:
    with pytest.raises(UsageError, match="--tls-cert, --tls-key and --tls-ca"):
        client_security(None, ca, cert, key)


def test_pem_files_that_are_missing_or_not_pem_are_named(tmp_path: Path) -> None:
    not_pem = tmp_path / "cert.pem"
    not_pem.write_text("hello")
    with pytest.raises(UsageError, match=f"CA certificate {tmp_path}/none.pem: No such file"):
        client_security(None, str(tmp_path / "none.pem"), None, None)
    with pytest.raises(UsageError, match=f"certificate {not_pem} is not a PEM file"):
        server_security(None, str(not_pem), str(not_pem), None)


def test_plain_configuration_has_no_credentials() -> None:
    assert server_security(None, None, None, None).credentials is None
    assert client_security(None, None, None, None).credentials is None


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1:29450", True), ("127.3.4.5:1", True), ("localhost:29450", True),
    ("[::1]:29450", True), ("unix:/tmp/x.sock", True), ("0.0.0.0:29450", False),
    ("[::]:29450", False), ("10.1.2.3:29450", False), ("node-a:29450", False)])
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback
