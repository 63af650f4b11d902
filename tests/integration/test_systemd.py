"""The systemd units as shipped: `systemd-analyze verify` and the offline security score of each
(ExecStart pointed at this environment's `watchdog`), the tmpfiles entry, the agent's capability
set against another user's process, and both daemons run outside systemd with the units' exact
arguments, credentials, state directories, capabilities and system call filters
(tests/helpers/units.py) and a real notify socket; the coordinator also with a PostgreSQL
server named the way its environment file would (a real server: tests/helpers/postgres.py).
DynamicUser= is not emulated: the coordinator runs as root with no capability."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import postgres as pg
from tests.helpers.capabilities import probe
from tests.helpers.harness import WATCHDOG, job_env, stop_process
from tests.helpers.scrape import scrape, value
from tests.helpers.secured import Certs, token_file
from tests.helpers.units import UNITS, Unit, syscall_filter, syscall_set, under_unit
from watchdog.cli.demo import free_port
from watchdog.coordinator.database import mask
from watchdog.coordinator.postgres_store import MIGRATIONS

EXPOSURE_LIMIT = {"agent": 5.0, "coordinator": 3.0}
AGENT_CAPABILITIES = {"CAP_SYS_PTRACE", "CAP_KILL", "CAP_SETUID", "CAP_SETGID"}
STARTUP_S = 60


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", ["agent", "coordinator"])
def test_unit_verifies_clean_and_is_hardened(name: str, tmp_path: Path) -> None:
    unit = Unit.read(name).for_analysis(tmp_path)
    verify = systemd_analyze("verify", str(unit))
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    security = systemd_analyze("security", "--offline=true", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", security.stdout)
    assert match, security.stdout + security.stderr
    assert float(match.group(1)) <= EXPOSURE_LIMIT[name], security.stdout


@pytest.mark.parametrize("name", ["agent", "coordinator"])
def test_the_filter_as_tests_build_it_is_the_filter_systemd_reads(name: str,
                                                                   tmp_path: Path) -> None:
    """tests/helpers/units.py merges SystemCallFilter= lines as systemd does: for each set that
    the security report checks, systemd-analyze finds a call of it allowed exactly when the
    model does, and the call it names is one the model allows."""
    unit = Unit.read(name)
    allow_list, calls = syscall_filter(unit.service["SystemCallFilter"])
    report = json.loads(systemd_analyze("security", "--offline=true", "--json=short",
                                        str(unit.for_analysis(tmp_path))).stdout)
    checks = {c["name"].removeprefix("SystemCallFilter=~"): c for c in report
              if c["name"].startswith("SystemCallFilter=~@")}
    assert allow_list and len(checks) >= 10, report
    for group, check in checks.items():
        allowed = syscall_set(group) & calls
        assert check["set"] == (not allowed), (group, check, sorted(allowed))
        named = re.search(r"e\.g\. (\w+) is allowed", check["description"])
        assert (named.group(1) if named else None) in (allowed or {None}), (group, check)


def test_the_agent_holds_two_capabilities_and_no_file_override() -> None:
    agent = Unit.read("agent")
    assert agent.capabilities() == AGENT_CAPABILITIES
    assert agent.one("AmbientCapabilities") == ""
    assert agent.one("NoNewPrivileges") == "yes"
    coordinator = Unit.read("coordinator")
    assert coordinator.one("CapabilityBoundingSet") == ""
    assert coordinator.one("DynamicUser") == "yes"


def test_the_tmpfiles_entry_makes_a_root_owned_sticky_beacon_directory(tmp_path: Path) -> None:
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    conf = UNITS / "torch-hang-watchdog.tmpfiles.conf"
    out = subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create", str(conf)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    made = (tmp_path / "dev" / "shm" / "torch-hang-watchdog").stat()
    assert (oct(made.st_mode & 0o7777), made.st_uid, made.st_gid) == ("0o1777", 0, 0)


# -- the agent's capabilities, against a process and a beacon of another user -----------------

def test_the_agents_capabilities_are_enough_and_each_is_needed(
        other_users_worker: tuple[int, Path]) -> None:
    pid, shared = other_users_worker
    caps = Unit.read("agent").capabilities()
    # Not a file of another user that it did not make readable, nor the links to that user's
    # open files, nor a file in that user's own beacon directory (no CAP_DAC_READ_SEARCH or
    # CAP_DAC_OVERRIDE); a worker's own log, as that worker, through the helper.
    assert probe(caps, pid, shared) == {"ptrace": "ok", "environ": "ok", "signal": "ok",
                                        "remove": "denied", "read_private": "denied",
                                        "fd_links": "denied", "read_as_owner": "ok"}
    need = {"CAP_SYS_PTRACE": ("ptrace", "environ"), "CAP_KILL": ("signal",),
            "CAP_SETUID": ("read_as_owner",), "CAP_SETGID": ("read_as_owner",)}
    for cap, actions in need.items():
        without = probe(caps - {cap}, pid, shared)
        assert all(without[action] == "denied" for action in actions), (cap, without)


# -- both daemons with the units' exact arguments, outside systemd -----------------------------

@dataclass
class Notifications:
    """The datagram socket systemd would pass as $NOTIFY_SOCKET, read by the test."""

    sock: socket.socket
    path: str

    def next(self, timeout: float = STARTUP_S) -> str:
        self.sock.settimeout(timeout)
        return self.sock.recv(4096).decode()

    def until(self, field: str) -> list[str]:
        seen = []
        while field not in (seen[-1] if seen else ""):
            seen.append(self.next())
        return seen


def unit_env(tmp_path: Path) -> dict[str, str]:
    """The tests' environment for a daemon, less the database they name: a unit's comes from
    its state directory, or its environment file."""
    return {key: value for key, value in job_env(tmp_path).items() if key != "WATCHDOG_DB"}


def notify_socket(path: Path) -> Notifications:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    return Notifications(sock, str(path))


def health(address: str, ca: str, service: str = "") -> str:
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(Path(ca).read_bytes())) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def test_daemons_run_with_the_units_arguments_credentials_and_state(
        certs: Certs, tmp_path: Path) -> None:
    ports = {port: free_port() for port in (29450, 29451, 29452)}
    files = {"token": token_file(tmp_path), "server.pem": certs.server_cert,
             "server.key": certs.server_key, "ca.pem": certs.ca}
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    daemons: dict[str, subprocess.Popen[str]] = {}
    notified: dict[str, Notifications] = {}
    try:
        for name in ("coordinator", "agent"):
            unit = Unit.read(name)
            creds = tmp_path / f"credentials-{name}"
            creds.mkdir(mode=0o700)
            for credential in unit.credentials():  # as LoadCredential= lays them out
                shutil.copy(files[credential], creds / credential)
                (creds / credential).chmod(0o400)
            env = {**unit.environment(), "CREDENTIALS_DIRECTORY": str(creds),
                   "STATE_DIRECTORY": str(state), "COORDINATOR": f"localhost:{ports[29450]}"}
            # Ports of this machine's other tests may be taken: the same words on free ports.
            cmd = [re.sub(r":(2945\d)$", lambda m: f":{ports[int(m.group(1))]}", word)
                   for word in unit.command(env)]
            notified[name] = notify_socket(tmp_path / f"notify-{name}")
            daemons[name] = subprocess.Popen(
                [*under_unit(unit), *cmd], text=True, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env={
                    **unit_env(tmp_path), **env, "NOTIFY_SOCKET": notified[name].path,
                    "WATCHDOG_USEC": "2000000"})  # WatchdogSec=2: pings within the test's time
            assert notified[name].next().startswith("READY=1\nSTATUS=")
        coordinator_address = f"localhost:{ports[29450]}"
        status = subprocess.run(
            [*WATCHDOG, "status", "--json", "--coordinator", coordinator_address,
             "--token-file", files["token"], "--tls-ca", certs.ca],
            capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout) == {"jobs": []}
        # The health service answers on the TLS port without the token (a probe has none).
        assert health(coordinator_address, certs.ca) == "SERVING"
        assert health(coordinator_address, certs.ca, "liveness") == "SERVING"
        assert wait_for(lambda: value(scrape(ports[29451]),
                                      "torch_hang_watchdog_agents_connected") == 1.0)
        assert value(scrape(ports[29452]), "torch_hang_watchdog_agent_ranks") == 0.0
        for name in daemons:
            assert notified[name].next(10) == "WATCHDOG=1"
            assert notified[name].next(10) == "WATCHDOG=1"
        assert (state / "incidents.db").exists()
        for name in ("agent", "coordinator"):
            daemons[name].send_signal(signal.SIGTERM)
            assert notified[name].until("STOPPING=1")[-1] == "STOPPING=1"
            assert daemons[name].wait(30) == 0
    finally:
        for proc in daemons.values():
            print(stop_process(proc))
        for notifications in notified.values():
            notifications.sock.close()


def test_the_coordinator_unit_stores_into_postgresql_named_by_its_environment_file(
        certs: Certs, postgres: pg.Cluster, tmp_path: Path) -> None:
    """What /etc/torch-hang-watchdog/coordinator.env would hold, the server's URL (TLS, checked
    against its CA) and the password, given to the unit's exact command: psycopg under the
    unit's capabilities, system call filter and MemoryDenyWriteExecute=."""
    unit = Unit.read("coordinator")
    assert unit.one("EnvironmentFile") == "-/etc/torch-hang-watchdog/coordinator.env"
    ca = shutil.copy(postgres.ca, tmp_path / "db-ca.pem")  # the server's own directory is its
    url = postgres.database(user=pg.PASSWORD_USER).replace(
        "sslmode=disable", f"sslmode=verify-full&sslrootcert={ca}")
    creds, state = tmp_path / "credentials", tmp_path / "state"
    for directory in (creds, state):
        directory.mkdir(mode=0o700)
    files = {"token": token_file(tmp_path), "server.pem": certs.server_cert,
             "server.key": certs.server_key}
    for credential in unit.credentials():
        shutil.copy(files[credential], creds / credential)
        (creds / credential).chmod(0o400)
    env = {**unit.environment(), "CREDENTIALS_DIRECTORY": str(creds),
           "STATE_DIRECTORY": str(state), "WATCHDOG_DB": url, "PGPASSWORD": pg.PASSWORD}
    cmd = [re.sub(r":(2945\d)$", lambda m: f":{free_port()}", word)
           for word in unit.command(env)]
    notified = notify_socket(tmp_path / "notify")
    coordinator = subprocess.Popen([*under_unit(unit), *cmd], text=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT,
                                   env={**unit_env(tmp_path), **env,
                                        "NOTIFY_SOCKET": notified.path})
    try:
        ready = notified.next()
    finally:
        log = stop_process(coordinator)
        notified.sock.close()
    with postgres.admin(pg.dbname(url)) as admin:
        version = admin.execute("SELECT version FROM incidents_schema").fetchall()
    assert ready.startswith("READY=1\nSTATUS=") and f"incidents in {mask(url)}" in ready, log
    assert version == [(len(MIGRATIONS),)], log  # the newest schema
    assert pg.PASSWORD not in log + ready and coordinator.returncode == 0, log


def wait_for(condition: Callable[[], bool], timeout: float = STARTUP_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False
