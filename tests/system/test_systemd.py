"""The units of deploy/systemd under a real systemd: a booted Debian 12 (systemd 252) with the
checkout's wheel, installed as the units' own comments tell an operator to. One machine for
the whole module: the services start through Type=notify, a job of an ordinary user hangs and
is named with its stack and the NCCL log its rank wrote (read by the agent's helper under the
unit's own sandbox and system call filter), a SIGKILLed agent is restarted by systemd and
watches the job again, incidents outlive a coordinator restart, and `systemctl stop` is clean."""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.daemons import until_verdict
from tests.helpers.machine import Machine, booted
from tests.helpers.secured import TOKEN, Certs
from tests.helpers.sysroot import USER, VENV, debian_root, project_wheel
from tests.helpers.units import UNITS

AGENT, COORDINATOR = "torch-hang-watchdog-agent", "torch-hang-watchdog-coordinator"
ETC = "/etc/torch-hang-watchdog"
CLIENT = f"--coordinator localhost:29450 --token-file {ETC}/token --tls-ca {ETC}/ca.pem"
JOB_ID = "system-job"
NCCL_LINE = "node-a:7:7 [0] NCCL WARN system-tier-4f2a"
NCCL_LOG = f"/home/{USER}/nccl.log"
# The operator's steps, from the units' and the tmpfiles entry's comments; `systemctl edit` is
# interactive, so its drop-in is written as it would write it.
INSTALL = f"""set -e
{VENV}/bin/pip install -q --no-index --no-deps /media/install/torch_hang_watchdog-*.whl
install -d -m 0755 {ETC}
for f in token server.pem server.key ca.pem; do install -m 0600 /media/install/$f {ETC}/; done
cp /media/install/units/{COORDINATOR}.service /media/install/units/{AGENT}.service \
    /etc/systemd/system/
cp /media/install/units/torch-hang-watchdog.tmpfiles.conf /etc/tmpfiles.d/torch-hang-watchdog.conf
systemd-tmpfiles --create /etc/tmpfiles.d/torch-hang-watchdog.conf
mkdir -p /etc/systemd/system/{AGENT}.service.d
printf '[Service]\\nEnvironment=COORDINATOR=localhost:29450\\n' \
    > /etc/systemd/system/{AGENT}.service.d/override.conf
systemctl daemon-reload
systemctl enable --now {COORDINATOR}
systemctl enable --now {AGENT}
"""
# The demo job, rank 1 stuck reading a sample from step 4, as a transient unit of the user.
JOB = (f"systemd-run --unit=train --uid={USER} --gid={USER} --working-directory=/home/{USER} "
       f"-E WATCHDOG_JOB_ID={JOB_ID} -E NCCL_DEBUG_FILE={NCCL_LOG} -E OMP_NUM_THREADS=1 "
       f"-E GLOO_SOCKET_IFNAME=lo {VENV}/bin/watchdog launch -- {VENV}/bin/python -m "
       f"torch.distributed.run --nproc_per_node=2 -m watchdog.demo.train --fault data_stall "
       f"--fault-rank 1 --fault-step 4")
HEALTH = f"""import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
ca = open("{ETC}/ca.pem", "rb").read()
with grpc.secure_channel("localhost:29450", grpc.ssl_channel_credentials(ca)) as channel:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
"""
AGENT_RANKS = """import urllib.request
text = urllib.request.urlopen("http://127.0.0.1:29452/metrics", timeout=10).read().decode()
name = "torch_hang_watchdog_agent_ranks "
print(next(line.split()[1] for line in text.splitlines() if line.startswith(name)))
"""


@pytest.fixture(scope="module")
def machine(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """The booted machine with both services enabled and started, as an operator leaves it."""
    root = debian_root()
    install = tmp_path_factory.mktemp("install")
    project_wheel(install)
    shutil.copytree(UNITS, install / "units")
    for name, source in [("server.pem", certs.server_cert), ("server.key", certs.server_key),
                         ("ca.pem", certs.ca)]:
        shutil.copy(source, install / name)
    (install / "token").write_text(TOKEN + "\n")
    with booted(root, install, install.parent / "console.log") as node:
        node.run(INSTALL, timeout=300)
        yield node


def show(machine: Machine, unit: str, *props: str) -> dict[str, str]:
    out = machine.run(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def python(machine: Machine, code: str) -> str:
    return machine.run(f"{VENV}/bin/python -c {shlex.quote(code)}").stdout.strip()


def status(machine: Machine) -> dict[str, Any] | None:
    out = machine.run(f"watchdog status --json {CLIENT}", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def incidents(machine: Machine) -> list[dict[str, Any]]:
    out = machine.run("watchdog incidents list --json "
                      "--db /var/lib/torch-hang-watchdog/incidents.db")
    return [i for i in json.loads(out.stdout) if i["job_id"] == JOB_ID]


@pytest.fixture(scope="module")
def hung_job(machine: Machine) -> dict[str, Any]:
    """The user's job, hung, as `watchdog status` names it."""
    machine.run(f"runuser -u {USER} -- sh -c \"umask 077; echo '{NCCL_LINE}' > {NCCL_LOG}\"")
    machine.run(JOB)
    return until_verdict(lambda: status(machine), JOB_ID)


def test_services_start_through_notify_and_serve_health(machine: Machine) -> None:
    for unit in (COORDINATOR, AGENT):
        assert show(machine, unit, "Type", "ActiveState", "UnitFileState") == {
            "Type": "notify", "ActiveState": "active", "UnitFileState": "enabled"}
    assert python(machine, HEALTH) == "SERVING"


def test_a_users_hang_is_named_with_its_stack_and_nccl_log(machine: Machine,
                                                           hung_job: dict[str, Any]) -> None:
    verdict = hung_job["verdict"]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("MISSING_RANKS", [1]), verdict
    culprit = next(r for r in verdict["ranks"] if r["rank"] == 1)
    assert "read_sample_from_storage" in [f["function"] for f in culprit["stack"]], culprit
    # Read through the helper that takes the user's uid, under the agent unit's sandbox.
    assert NCCL_LINE in culprit["nccl_log"], machine.run(f"journalctl -u {AGENT}").stdout
    assert [i["id"] for i in incidents(machine)] == [verdict["id"]]


def test_a_killed_agent_is_restarted_and_watches_the_job_again(
        machine: Machine, hung_job: dict[str, Any]) -> None:
    before = show(machine, AGENT, "MainPID")["MainPID"]
    machine.run(f"systemctl kill -s SIGKILL {AGENT}")
    deadline = time.monotonic() + 60
    # Active again only once the new agent said READY=1 (Type=notify).
    while ((now := show(machine, AGENT, "ActiveState", "MainPID", "NRestarts"))["MainPID"]
           == before or now["ActiveState"] != "active"):
        assert time.monotonic() < deadline, now
        time.sleep(0.5)
    assert now["NRestarts"] == "1", now
    while python(machine, AGENT_RANKS) != "2.0":  # the restarted agent's own count
        assert time.monotonic() < deadline, "the restarted agent never found the job's ranks"
        time.sleep(0.5)
    journal = machine.run(f"journalctl -u {AGENT} --no-pager -o cat").stdout
    assert journal.count(f"tracking rank 1 of job {JOB_ID}") == 2, journal  # once per agent


def test_incidents_survive_a_coordinator_restart(machine: Machine,
                                                 hung_job: dict[str, Any]) -> None:
    machine.run(f"systemctl restart {COORDINATOR}")
    assert show(machine, COORDINATOR, "ActiveState")["ActiveState"] == "active"
    assert hung_job["verdict"]["id"] in [i["id"] for i in incidents(machine)]


def test_stop_is_clean_and_the_journal_has_the_daemons_lines(machine: Machine) -> None:
    machine.run("systemctl stop train", check=False)
    machine.run(f"systemctl stop {AGENT} {COORDINATOR}", timeout=60)
    for unit in (COORDINATOR, AGENT):
        assert show(machine, unit, "ActiveState", "Result") == {
            "ActiveState": "inactive", "Result": "success"}
    coordinator = machine.run(f"journalctl -u {COORDINATOR} --no-pager -o cat").stdout
    assert "listening on 0.0.0.0:29450" in coordinator, coordinator
