"""deploy/kubernetes rendered as `kubectl apply -k overlays/example` would (credential files
made in a copy: a token per role, a CA and the coordinator's certificate), and
overlays/postgres (the example, its incidents on a PostgreSQL server: a URL and the server's
CA), every manifest validated with `kubernetes-validate --strict` for Kubernetes 1.29 (native
sidecars) and the newest it knows, the properties the deployment relies on, and the coordinator
and an agent run with the manifests' own arguments and the Secrets laid out as the kubelet
mounts them."""

from __future__ import annotations

import base64
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.attack import spawn, wait_for
from tests.helpers.capabilities import probe
from tests.helpers.harness import WATCHDOG, job_env
from tests.helpers.kustomize import Doc, comparable, kubectl_kustomize, render
from tests.helpers.scrape import scrape, value
from tests.helpers.secured import Certs
from watchdog.cli.demo import free_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
ROLES = ("agent", "reader", "control")
VERSIONS = ("1.29.0", "1.37.0")
MOUNT = "/var/run/secrets/torch-hang-watchdog"
DATABASE_MOUNT = "/var/run/secrets/torch-hang-watchdog-database"
DATABASE_URL = ("postgresql://watchdog:PASSWORD@db.example:5432/incidents?sslmode=verify-full"
                f"&sslrootcert={DATABASE_MOUNT}/ca.crt")


@pytest.fixture(scope="module")
def tokens() -> dict[str, str]:
    return {role: secrets.token_hex(16) for role in ROLES}


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory, certs: Certs,
            tokens: dict[str, str]) -> Path:
    """A copy of deploy/kubernetes with the example's credential files in place."""
    copy = tmp_path_factory.mktemp("kubernetes") / "kubernetes"
    shutil.copytree(DEPLOY, copy)
    files = {**{f"{role}-token": f"{token}\n" for role, token in tokens.items()},
             "ca.crt": Path(certs.ca).read_text(), "tls.crt": Path(certs.server_cert).read_text(),
             "tls.key": Path(certs.server_key).read_text()}
    for name, text in files.items():
        (copy / "overlays" / "example" / name).write_text(text)
    (copy / "overlays" / "postgres" / "database-url").write_text(f"{DATABASE_URL}\n")
    (copy / "overlays" / "postgres" / "database-ca.crt").write_text(Path(certs.ca).read_text())
    return copy / "overlays" / "example"


@pytest.fixture(scope="module")
def manifests(example: Path) -> list[Doc]:
    return kubectl_kustomize(example) or render(example)


@pytest.fixture(scope="module")
def postgres_manifests(example: Path) -> list[Doc]:
    overlay = example.parent / "postgres"
    return kubectl_kustomize(overlay) or render(overlay)


@pytest.mark.parametrize("overlay", ["example", "postgres"])
def test_the_small_renderer_agrees_with_kustomize(example: Path, overlay: str) -> None:
    rendered = kubectl_kustomize(example.parent / overlay)
    if rendered is None:
        pytest.skip("no kubectl here: the manifests were rendered by tests/integration/"
                    "tests/helpers/kustomize.py alone")
    assert comparable(render(example.parent / overlay)) == comparable(rendered)


@pytest.mark.parametrize(("overlay", "count"), [("example", 12), ("postgres", 13)])
@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly(overlay: str, count: int, version: str,
                                           tmp_path: Path, request: pytest.FixtureRequest) -> None:
    manifests = request.getfixturevalue("manifests" if overlay == "example"
                                        else "postgres_manifests")
    files = []
    for doc in manifests:
        path = tmp_path / f"{doc['kind']}-{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        files.append(str(path))
    validator = Path(sys.executable).parent / "kubernetes-validate"
    out = subprocess.run([str(validator), "--strict", "--kubernetes-version", version, *files],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" passed for resource ") == len(manifests) == count


def test_a_misspelt_field_fails_validation(tmp_path: Path) -> None:
    """The strict check above can fail: an unknown field is refused."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "x"}, "spec": {"ports": [{"port": 1, "targetPrt": 2}]}}))
    validator = Path(sys.executable).parent / "kubernetes-validate"
    out = subprocess.run([str(validator), "--strict", "--kubernetes-version", VERSIONS[0],
                          str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0


def one(manifests: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in manifests if d["kind"] == kind]
    return doc


def pod(manifests: list[Doc], kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(manifests, kind)["spec"]["template"]["spec"]
    return spec


def secret_data(manifests: list[Doc], volume_owner: dict[str, Any]) -> dict[str, str]:
    """The decoded data of the Secret that the pod `volume_owner` mounts as `credentials`."""
    (volume,) = [v for v in volume_owner["volumes"] if v["name"] == "credentials"]
    (secret,) = [d for d in manifests if d["kind"] == "Secret"
                 and d["metadata"]["name"] == volume["secret"]["secretName"]]
    return {key: base64.b64decode(data).decode() for key, data in secret["data"].items()}


def generated(manifests: list[Doc], name: str) -> dict[str, str]:
    """The decoded data of the Secret the overlay's generator `name` made."""
    (secret,) = [d for d in manifests if d["kind"] == "Secret"
                 and d["metadata"]["name"].rpartition("-")[0] == name]
    return {key: base64.b64decode(data).decode() for key, data in secret["data"].items()}


def test_the_agent_is_a_native_sidecar_with_ptrace_and_its_log_helpers_ids(
        manifests: list[Doc]) -> None:
    spec = pod(manifests, "Job")
    (agent,) = spec["initContainers"]
    (trainer,) = spec["containers"]
    assert agent["restartPolicy"] == "Always"
    assert agent["image"] == "registry.example/torch-hang-watchdog:0.1.0"
    assert spec["shareProcessNamespace"] is True
    # SETUID and SETGID: the log helper takes a rank's uid, gid and groups (issue 20).
    assert agent["securityContext"]["capabilities"] == {
        "drop": ["ALL"], "add": ["SYS_PTRACE", "SETUID", "SETGID"]}
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    assert trainer["securityContext"]["runAsNonRoot"] is True
    (dshm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    for container in (agent, trainer):
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    (job_id,) = [e for e in trainer["env"] if e["name"] == "WATCHDOG_JOB_ID"]
    assert job_id["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/job-name']")
    assert "--node-name=$(POD_NAME)" in agent["args"]
    assert agent["livenessProbe"]["grpc"] == {"port": 29453, "service": "liveness"}
    assert f"--tls-ca={MOUNT}/ca.crt" in agent["args"]


def test_the_agent_containers_capabilities_read_a_ranks_log_as_the_rank(
        manifests: list[Doc], other_users_worker: tuple[int, Path]) -> None:
    """Root holding the container's capabilities alone, with no_new_privs
    (allowPrivilegeEscalation: false), against a process of another user."""
    (agent,) = pod(manifests, "Job")["initContainers"]
    caps = {f"CAP_{name}" for name in agent["securityContext"]["capabilities"]["add"]}
    pid, shared = other_users_worker
    assert probe(caps, pid, shared) == {"ptrace": "ok", "environ": "ok", "signal": "denied",
                                        "remove": "denied", "read_private": "denied",
                                        "fd_links": "denied", "read_as_owner": "ok"}


def test_the_coordinator_keeps_its_database_and_is_probed_over_grpc(
        manifests: list[Doc]) -> None:
    spec = pod(manifests, "Deployment")
    (coordinator,) = spec["containers"]
    args = coordinator["args"]
    assert not [arg for arg in args if arg.startswith("--db")]  # the environment says
    env = {e["name"]: e for e in coordinator["env"]}
    # No Secret torch-hang-watchdog-database here: SQLite, STATE_DIRECTORY/incidents.db.
    assert env["STATE_DIRECTORY"]["value"] == "/var/lib/torch-hang-watchdog"
    assert env["WATCHDOG_DB"]["valueFrom"]["secretKeyRef"] == {
        "name": "torch-hang-watchdog-database", "key": "url", "optional": True}
    assert not [d for d in manifests if d["metadata"]["name"].startswith(
        "torch-hang-watchdog-database")]
    assert "--health-listen=0.0.0.0:29453" in args
    assert {"name": "incidents", "mountPath": "/var/lib/torch-hang-watchdog"} in (
        coordinator["volumeMounts"])
    (incidents,) = [v for v in spec["volumes"] if v["name"] == "incidents"]
    pvc = one(manifests, "PersistentVolumeClaim")
    assert incidents["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert coordinator[kind]["grpc"]["port"] == 29453
    assert coordinator["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_the_postgres_overlay_gives_the_coordinator_alone_the_url_from_a_secret(
        postgres_manifests: list[Doc], certs: Certs) -> None:
    spec = pod(postgres_manifests, "Deployment")
    (coordinator,) = spec["containers"]
    (variable,) = [e for e in coordinator["env"] if e["name"] == "WATCHDOG_DB"]
    ref = variable["valueFrom"]["secretKeyRef"]
    database = generated(postgres_manifests, "torch-hang-watchdog-database")
    assert ref["name"].rpartition("-")[0] == "torch-hang-watchdog-database"
    assert database == {"url": f"{DATABASE_URL}\n", "ca.crt": Path(certs.ca).read_text()}
    (volume,) = [v for v in spec["volumes"] if v["name"] == "database"]
    assert volume["secret"]["secretName"] == ref["name"]
    assert {"name": "database", "mountPath": DATABASE_MOUNT, "readOnly": True} in (
        coordinator["volumeMounts"])
    assert not [arg for arg in coordinator["args"] if "postgresql" in arg]
    job = pod(postgres_manifests, "Job")
    for container in job["containers"] + job["initContainers"]:  # the trainers' pods: none
        assert "torch-hang-watchdog-database" not in yaml.safe_dump(container)
    assert {"name": "incidents", "mountPath": "/var/lib/torch-hang-watchdog"} in (
        coordinator["volumeMounts"])  # what waits while the server is down


def test_each_role_has_a_token_of_its_own_and_the_trainer_none(
        manifests: list[Doc], tokens: dict[str, str]) -> None:
    coordinator = pod(manifests, "Deployment")
    (container,) = coordinator["containers"]
    assert set(secret_data(manifests, coordinator)) == {
        "agent-token", "reader-token", "control-token", "tls.crt", "tls.key"}
    assert not [arg for arg in container["args"] if arg.startswith("--token-file")]
    for role in ROLES:  # the coordinator knows each role's token from its own file
        assert f"--{role}-token-file={MOUNT}/{role}-token" in container["args"]
        assert generated(manifests, "torch-hang-watchdog-coordinator")[f"{role}-token"] == (
            f"{tokens[role]}\n")
        client = generated(manifests, f"torch-hang-watchdog-{role}")
        assert client.keys() == {"token", "ca.crt"}  # never the coordinator's key
        assert client["token"] == f"{tokens[role]}\n"
    job = pod(manifests, "Job")
    assert secret_data(manifests, job)["token"] == f"{tokens['agent']}\n"
    (agent,) = job["initContainers"]
    (trainer,) = job["containers"]
    assert {"name": "credentials", "mountPath": MOUNT, "readOnly": True} in agent["volumeMounts"]
    assert [m["name"] for m in trainer["volumeMounts"]] == ["dshm"]  # no token at all
    assert "envFrom" not in trainer
    assert not [e for e in trainer["env"] if "secretKeyRef" in e.get("valueFrom", {})]


def test_only_agents_readers_and_control_of_listed_namespaces_reach_the_coordinator(
        manifests: list[Doc]) -> None:
    policy = one(manifests, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    namespace = one(manifests, "Namespace")["metadata"]["name"]
    admitted: dict[str, list[int]] = {}
    for rule in policy["ingress"]:
        for peer in rule["from"]:
            # A namespace AND a label, in one element: the label alone anyone may set.
            assert peer["namespaceSelector"] == {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}]}
            role = peer["podSelector"]["matchLabels"]["torch-hang-watchdog/role"]
            admitted[role] = sorted(port["port"] for port in rule["ports"])
    assert admitted == {"agent": [29450], "control": [29450], "reader": [29450, 29451]}
    job = one(manifests, "Job")
    assert job["metadata"]["namespace"] == namespace
    assert job["spec"]["template"]["metadata"]["labels"]["torch-hang-watchdog/role"] == "agent"


# -- the coordinator and an agent with the manifests' own arguments ---------------------------

def mounted(manifests: list[Doc], owner: dict[str, Any], directory: Path) -> Path:
    """The Secret mounted at `credentials`, as the kubelet lays it out: a file per key, of the
    volume's defaultMode."""
    (volume,) = [v for v in owner["volumes"] if v["name"] == "credentials"]
    directory.mkdir()
    for key, text in secret_data(manifests, owner).items():
        (directory / key).write_text(text)
        (directory / key).chmod(volume["secret"]["defaultMode"])
    return directory


def local(args: list[str], ports: dict[int, int], words: dict[str, str]) -> list[str]:
    """`args` with this machine's free ports and paths (`words`) in place of the pod's."""
    out = []
    for arg in args:
        for port, free in ports.items():
            arg = arg.replace(f":{port}", f":{free}")
        for word, here in words.items():
            arg = arg.replace(word, here)
        out.append(arg)
    return out


def test_the_manifests_daemons_tell_the_roles_apart(manifests: list[Doc], tmp_path: Path) -> None:
    deployment, job = pod(manifests, "Deployment"), pod(manifests, "Job")
    ((coordinator,), (agent,)) = deployment["containers"], job["initContainers"]
    ports = {port: free_port() for port in (29450, 29451, 29452, 29453)}
    server = mounted(manifests, deployment, tmp_path / "coordinator")
    client = mounted(manifests, job, tmp_path / "agent")
    daemons = [spawn([*WATCHDOG, *local(coordinator["args"], ports, {
        MOUNT: str(server), "/var/lib/torch-hang-watchdog": str(tmp_path)})],
        tmp_path / "coordinator.log", job_env(tmp_path), ready="listening on")]
    try:
        for role in ROLES:  # each role's token, as its own Secret holds it
            token = tmp_path / f"{role}-token"
            token.write_text(generated(manifests, f"torch-hang-watchdog-{role}")["token"])
            token.chmod(0o600)
            status = subprocess.run([*WATCHDOG, "status", "--json", "--coordinator",
                                     f"localhost:{ports[29450]}", "--token-file", str(token),
                                     "--tls-ca", str(client / "ca.crt")],
                                    capture_output=True, text=True, timeout=60)
            if role == "agent":  # it may report, never read
                assert status.returncode != 0, status
                assert "the agent token may not call Status" in status.stderr, status
            else:
                assert (status.returncode, status.stdout) == (0, '{"jobs": []}\n'), status
        # Another pod in the cluster: a health port of its own here.
        daemons.append(spawn([*WATCHDOG, *local(agent["args"], {**ports, 29453: free_port()}, {
            MOUNT: str(client), "$(POD_NAME)": "trainer-0-x",
            "torch-hang-watchdog-coordinator.ml-training.svc": "localhost"})],
            tmp_path / "agent.log", job_env(tmp_path), ready="watchdog agent"))
        assert wait_for(lambda: value(scrape(ports[29451]),
                                      "torch_hang_watchdog_agents_connected") == 1.0,
                        "the agent, with the agent's token, to connect")
    finally:
        for started in daemons:
            started.stop()
