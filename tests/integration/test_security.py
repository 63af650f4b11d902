"""Tokens, TLS and hostile input against a real `watchdog coordinator` on loopback.

Coordinators run as subprocesses (the real CLI, the real Coordinator and a real SqliteStore);
clients are the real CoordinatorClient, the real `watchdog status`, and raw gRPC channels that
send bytes of our choosing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.harness import WATCHDOG
from tests.helpers.secured import (
    CONNECT,
    INVALID,
    OK,
    REFUSED_CODE,
    STATUS,
    TOKEN,
    Certs,
    Daemon,
    coordinator,
    raw_call,
    token_file,
    write_key,
)
from watchdog.cli.demo import free_port
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.coordinator.stall import StallPolicy
from watchdog.errors import AuthError, CoordinatorUnreachableError, UsageError
from watchdog.model import NodeReport, RankState
from watchdog.transport.auth import REFUSED, ClientSecurity, client_security, server_security
from watchdog.transport.limits import MAX_MESSAGE_BYTES
from watchdog.transport.proto import watchdog_pb2 as pb
from watchdog.transport.proto import watchdog_pb2_grpc as pb_grpc
from watchdog.transport.rpc import CoordinatorClient, start_server


def watchdog_status(address: str, *flags: str,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WATCHDOG, "status", "--json", "--coordinator", address, *flags],
                          capture_output=True, text=True, timeout=60, env=env)


def jobs(address: str, token: str | None = None) -> list[str]:
    """Job ids from a valid Status call: raises unless the coordinator still serves."""
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.CoordinatorStub(channel).Status(
            pb.StatusRequest(), timeout=20, metadata=ClientSecurity(token).metadata())
    return [job["job_id"] for job in json.loads(reply.status_json)["jobs"]]


def report(job_id: str) -> NodeReport:
    now = time.time()
    return NodeReport("node-t", now, (RankState(
        job_id=job_id, rank=0, local_rank=0, world_size=1, host="node-t", pid=4242, hooked=True,
        proc_state="S", heartbeat_age=0.1, steps=1, events=3, last_event_at=now),))


async def send_report(address: str, security: ClientSecurity, job_id: str) -> None:
    async def one_report() -> AsyncIterator[NodeReport]:
        yield report(job_id)

    client = CoordinatorClient(address, security)
    try:
        async for _ in client.connect(one_report()):
            pass
    finally:
        await client.close()


async def status_json(address: str, security: ClientSecurity) -> str:
    client = CoordinatorClient(address, security)
    try:
        return await client.status_json()
    finally:
        await client.close()


# -- tokens ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("guarded")
    with coordinator(tmp, "--token-file", token_file(tmp)) as daemon:
        yield daemon


def test_right_token_passes_on_both_methods(guarded: Daemon) -> None:
    asyncio.run(send_report(guarded.address, ClientSecurity(TOKEN), "job-with-token"))
    status = json.loads(asyncio.run(status_json(guarded.address, ClientSecurity(TOKEN))))
    assert "job-with-token" in [job["job_id"] for job in status["jobs"]]


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x", TOKEN[:-1]])
def test_missing_or_wrong_token_is_refused(guarded: Daemon, token: str | None) -> None:
    security = ClientSecurity(token)
    with pytest.raises(AuthError, match=REFUSED):
        asyncio.run(status_json(guarded.address, security))
    with pytest.raises(AuthError, match=REFUSED):
        asyncio.run(send_report(guarded.address, security, "job-without-token"))
    assert raw_call(guarded.address, STATUS, pb.StatusRequest().SerializeToString(),
                    token) == REFUSED_CODE
    assert raw_call(guarded.address, CONNECT, b"\xff garbage is not even parsed",
                    token) == REFUSED_CODE
    assert "job-without-token" not in jobs(guarded.address, TOKEN)
    log = guarded.output()
    assert f"refused {STATUS} from ipv4:127.0.0.1:" in log
    assert f"refused {CONNECT} from ipv4:127.0.0.1:" in log
    assert TOKEN not in log and "wrong-token" not in log


def test_status_command_with_token(guarded: Daemon, tmp_path: Path) -> None:
    ok = watchdog_status(guarded.address, "--token-file", token_file(tmp_path))
    assert ok.returncode == 0, ok.stderr
    assert "jobs" in json.loads(ok.stdout)
    from_env = watchdog_status(guarded.address, env={**os.environ, "WATCHDOG_TOKEN": TOKEN})
    assert from_env.returncode == 0, from_env.stderr
    for flags in ((), ("--token-file", token_file(tmp_path, "not-the-token"))):
        refused = watchdog_status(guarded.address, *flags)
        assert refused.returncode == 1
        assert REFUSED in refused.stderr
        assert "hint: pass the coordinator's token with --token-file" in refused.stderr
    exposed = watchdog_status(guarded.address, "--token-file",
                              token_file(tmp_path, mode=0o644))
    assert exposed.returncode == 2
    assert "chmod 600" in exposed.stderr


def test_coordinator_refuses_an_exposed_token_file(tmp_path: Path) -> None:
    path = token_file(tmp_path, mode=0o604)
    out = subprocess.run([*WATCHDOG, "coordinator", "--listen", f"127.0.0.1:{free_port()}",
                          "--db", str(tmp_path / "i.db"), "--token-file", path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"token file {path} is accessible to every user" in out.stderr
    assert f"hint: chmod 600 {path}" in out.stderr
    assert "listening" not in out.stderr


def test_a_second_coordinator_on_a_taken_port_says_so(guarded: Daemon, tmp_path: Path) -> None:
    out = subprocess.run([*WATCHDOG, "coordinator", "--listen", guarded.address, "--db",
                          str(tmp_path / "i.db"), "--token-file", token_file(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert f"cannot listen on {guarded.address}" in out.stderr
    assert "hint: is another coordinator using that port?" in out.stderr
    assert "Traceback" not in out.stderr


def test_agent_with_wrong_token_keeps_retrying(guarded: Daemon, tmp_path: Path) -> None:
    def agent(token: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"agent-{token[:5]}.log"
        with log.open("wb") as out:
            return subprocess.Popen(
                [*WATCHDOG, "agent", "--coordinator", guarded.address, "--interval", "0.2",
                 "--beacon-dir", str(tmp_path / "beacons"), "--node-name", f"node-{token[:5]}",
                 "--token-file", token_file(tmp_path, token)],
                stdout=out, stderr=subprocess.STDOUT), log

    (wrong, wrong_log), (right, right_log) = agent("wrong-token"), agent(TOKEN)
    try:
        deadline = time.monotonic() + 30
        while (wrong_log.read_text().count(REFUSED) < 2
               or "agent connected" not in guarded.output()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert wrong.poll() is None and right.poll() is None
    finally:
        for proc in (wrong, right):
            proc.terminate()
            proc.wait(15)
    assert wrong_log.read_text().count(REFUSED) >= 2, wrong_log.read_text()
    assert "retrying in" in wrong_log.read_text()
    assert REFUSED not in right_log.read_text(), right_log.read_text()
    assert "agent connected" in guarded.output()


# -- hostile input ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def open_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with coordinator(tmp_path_factory.mktemp("open")) as daemon:
        yield daemon


def _parses(message_type: type[pb.StatusRequest] | type[pb.AgentMessage], payload: bytes) -> bool:
    try:
        message_type.FromString(payload)
    except DecodeError:
        return False
    return True


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=512) | st.sampled_from([b"\xff" * 64, b"\x0a\x05hello"]))
def test_garbage_is_rejected_and_the_coordinator_keeps_serving(
        open_door: Daemon, payload: bytes) -> None:
    for method, message_type in ((STATUS, pb.StatusRequest), (CONNECT, pb.AgentMessage)):
        # A payload that happens to parse is an ordinary message: answered, or dropped by _wire.
        expected = OK if _parses(message_type, payload) else INVALID
        assert raw_call(open_door.address, method, payload) == expected
    jobs(open_door.address)
    assert open_door.proc.poll() is None


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(MAX_MESSAGE_BYTES + 1, MAX_MESSAGE_BYTES + (1 << 20)))
def test_oversized_messages_are_rejected(open_door: Daemon, size: int) -> None:
    payload = b"\x0a" + b"\xff" * (size - 1)
    for method in (STATUS, CONNECT):
        assert raw_call(open_door.address, method, payload) == grpc.StatusCode.RESOURCE_EXHAUSTED
    jobs(open_door.address)


def test_garbage_is_logged_in_one_line(open_door: Daemon) -> None:
    assert raw_call(open_door.address, STATUS, b"\xff\xff\xff") == INVALID
    log = open_door.output()
    assert "rejected 3 bytes from ipv4:127.0.0.1:" in log
    assert "Traceback" not in log


def test_without_a_token_only_loopback_is_served_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def listen(address: str) -> None:
        store = SqliteStore(str(tmp_path / "i.db"))
        server, _ = await start_server(Coordinator(store, StallPolicy()), address)
        await server.stop(None)
        store.close()

    with caplog.at_level(logging.WARNING, logger="watchdog.transport.rpc"):
        asyncio.run(listen(f"unix:{tmp_path}/c.sock"))
        assert "without a token" not in caplog.text
        asyncio.run(listen("127.0.0.1:0"))
        with pytest.raises(UsageError, match=r"listening on 0\.0\.0\.0:0 without a token would "
                                             "let anyone who reaches it read every job"):
            asyncio.run(listen("0.0.0.0:0"))
    assert ("listening on 127.0.0.1:0 without a token: only root and uid 0 on this machine may "
            "call it") in caplog.text


# -- TLS -------------------------------------------------------------------------------------


def test_tls_status_works_and_plaintext_fails(certs: Certs, tmp_path: Path) -> None:
    async def serve_and_ask() -> tuple[str, BaseException]:
        store = SqliteStore(str(tmp_path / "i.db"))
        server, port = await start_server(
            Coordinator(store, StallPolicy()), "127.0.0.1:0",
            server_security(None, certs.server_cert, certs.server_key, None))
        address = f"127.0.0.1:{port}"
        try:
            answer = await status_json(address, client_security(None, certs.ca, None, None))
            try:
                await status_json(address, ClientSecurity())
            except CoordinatorUnreachableError as e:
                return answer, e
            raise AssertionError("a plaintext client got an answer from a TLS coordinator")
        finally:
            await server.stop(None)
            store.close()

    answer, plaintext_error = asyncio.run(serve_and_ask())
    assert json.loads(answer) == {"jobs": []}
    assert "coordinator at 127.0.0.1:" in str(plaintext_error)
    assert "if it speaks TLS, pass --tls-ca" in str(plaintext_error)


def test_mutual_tls_with_token_through_the_cli(certs: Certs, tmp_path: Path) -> None:
    token = token_file(tmp_path)
    client_flags = ("--tls-ca", certs.ca, "--tls-cert", certs.client_cert,
                    "--tls-key", certs.client_key, "--token-file", token)
    with coordinator(tmp_path, "--tls-cert", certs.server_cert, "--tls-key", certs.server_key,
                     "--tls-client-ca", certs.ca, "--token-file", token) as daemon:
        ok = watchdog_status(daemon.address, *client_flags)
        without_client_cert = watchdog_status(daemon.address, "--tls-ca", certs.ca,
                                              "--token-file", token)
        plaintext = watchdog_status(daemon.address, "--token-file", token)
        no_token = watchdog_status(daemon.address, *client_flags[:6])
        assert daemon.proc.poll() is None
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"jobs": []}
    for refused in (without_client_cert, plaintext):
        assert refused.returncode == 1
        assert "coordinator at 127.0.0.1:" in refused.stderr
        assert "--tls-ca" in refused.stderr
    assert no_token.returncode == 1
    assert REFUSED in no_token.stderr


def test_unusable_tls_files_are_named(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"key {certs.other_key} does not go with certificate "
                                         f"{certs.server_cert}"):
        server_security(None, certs.server_cert, certs.other_key, None)
    encrypted = write_key(tmp_path / "encrypted.key", ec.generate_private_key(ec.SECP256R1()),
                           serialization.BestAvailableEncryption(b"secret"))
    with pytest.raises(UsageError, match=f"key {encrypted} is encrypted"):
        client_security(None, certs.ca, certs.client_cert, encrypted)
    with pytest.raises(UsageError, match=f"CA certificate {certs.server_key} does not parse"):
        server_security(None, certs.server_cert, certs.server_key, certs.server_key)
    out = subprocess.run([*WATCHDOG, "coordinator", "--listen", f"127.0.0.1:{free_port()}",
                          "--db", str(tmp_path / "i.db"), "--tls-cert",
                          str(tmp_path / "missing.pem"), "--tls-key", certs.server_key],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"cannot read certificate {tmp_path}/missing.pem: No such file" in out.stderr
