"""The standard gRPC health service (a grpc_health.v1 client) of a real coordinator and a real
agent: answered without a token, SERVING while each daemon's loop runs and, for the agent, while
its stream to the coordinator is up."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.harness import WATCHDOG, job_env, stop_process
from tests.helpers.scrape import scrape, value
from tests.helpers.secured import REFUSED_CODE, STATUS, Certs, coordinator, raw_call, token_file
from watchdog.cli.demo import free_port

DEADLINE_S = 60


def check(address: str, service: str = "") -> str:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def becomes(address: str, service: str, expected: str) -> str:
    """The status once it is `expected`, or the last one seen after DEADLINE_S (a daemon still
    starting answers nothing yet)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            status = check(address, service)
        except grpc.RpcError as e:
            status = f"no answer: {e}"
        if status == expected or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


@contextmanager
def agent(tmp_path: Path, coordinator_address: str, *flags: str) -> Iterator[str]:
    """An agent serving health checks; yields the health address."""
    health = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([*WATCHDOG, "agent", "--coordinator", coordinator_address,
                             "--interval", "0.25", "--health-listen", health, *flags],
                            env=job_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        yield health
    finally:
        print(stop_process(proc))


def test_agent_health_follows_its_stream_and_liveness_its_loop(tmp_path: Path) -> None:
    token = token_file(tmp_path)
    with coordinator(tmp_path, "--token-file", token) as hub:
        # A probe carries no token: the health service answers, the coordinator's own do not.
        assert check(hub.address) == "SERVING"
        assert check(hub.address, "liveness") == "SERVING"
        assert raw_call(hub.address, STATUS, b"") == REFUSED_CODE
        with agent(tmp_path, hub.address, "--token-file", token) as health:
            assert becomes(health, "", "SERVING") == "SERVING"
            assert check(health, "liveness") == "SERVING"
            hub.proc.kill()
            hub.proc.wait()
            assert becomes(health, "", "NOT_SERVING") == "NOT_SERVING"
            assert check(health, "liveness") == "SERVING"  # nothing a restart would mend


def test_an_agent_refused_by_its_coordinator_is_not_serving(tmp_path: Path) -> None:
    metrics = free_port()
    with coordinator(tmp_path, "--token-file", token_file(tmp_path)) as hub, agent(
            tmp_path, hub.address, "--token-file", token_file(tmp_path, "wrong-token-0123456"),
            "--metrics-listen", f"127.0.0.1:{metrics}") as health:
        assert becomes(health, "liveness", "SERVING") == "SERVING"
        deadline = time.monotonic() + DEADLINE_S
        while reconnects(metrics) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert reconnects(metrics) >= 2  # refused, and tried again
        assert check(health) == "NOT_SERVING"


def reconnects(port: int) -> float:
    return value(scrape(port), "torch_hang_watchdog_reconnects_total") or 0.0


def test_a_tls_coordinator_serves_plaintext_health_for_probes(certs: Certs,
                                                              tmp_path: Path) -> None:
    health = f"127.0.0.1:{free_port()}"
    with coordinator(tmp_path, "--tls-cert", certs.server_cert, "--tls-key", certs.server_key,
                     "--health-listen", health):
        assert becomes(health, "", "SERVING") == "SERVING"
        assert check(health, "liveness") == "SERVING"
