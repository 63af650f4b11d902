"""deploy/kubernetes rendered as `kubectl apply -k overlays/example` would (credential files
made up in a copy), every manifest validated with `kubernetes-validate --strict` for Kubernetes
1.29 (native sidecars) and the newest it knows, and the properties the deployment relies on."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.kustomize import Doc, comparable, kubectl_kustomize, render

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
CREDENTIALS = ("token", "ca.crt", "tls.crt", "tls.key")
VERSIONS = ("1.29.0", "1.37.0")


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/kubernetes with the example's credential files in place."""
    copy = tmp_path_factory.mktemp("kubernetes") / "kubernetes"
    shutil.copytree(DEPLOY, copy)
    for name in CREDENTIALS:
        (copy / "overlays" / "example" / name).write_text(f"made-up {name}\n")
    return copy / "overlays" / "example"


@pytest.fixture(scope="module")
def manifests(example: Path) -> list[Doc]:
    return kubectl_kustomize(example) or render(example)


def test_the_small_renderer_agrees_with_kustomize(example: Path) -> None:
    rendered = kubectl_kustomize(example)
    if rendered is None:
        pytest.skip("no kubectl here: the manifests were rendered by tests/integration/"
                    "tests/helpers/kustomize.py alone")
    assert comparable(render(example)) == comparable(rendered)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly(manifests: list[Doc], version: str,
                                           tmp_path: Path) -> None:
    files = []
    for doc in manifests:
        path = tmp_path / f"{doc['kind']}-{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        files.append(str(path))
    validator = Path(sys.executable).parent / "kubernetes-validate"
    out = subprocess.run([str(validator), "--strict", "--kubernetes-version", version, *files],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" passed for resource ") == len(manifests) == 10


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


def test_the_agent_is_a_native_sidecar_with_ptrace_alone(manifests: list[Doc]) -> None:
    spec = pod(manifests, "Job")
    (agent,) = spec["initContainers"]
    (trainer,) = spec["containers"]
    assert agent["restartPolicy"] == "Always"
    assert agent["image"] == "registry.example/torch-hang-watchdog:0.1.0"
    assert spec["shareProcessNamespace"] is True
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
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
    assert "--tls-ca=/var/run/secrets/torch-hang-watchdog/ca.crt" in agent["args"]


def test_the_coordinator_keeps_its_database_and_is_probed_over_grpc(
        manifests: list[Doc]) -> None:
    spec = pod(manifests, "Deployment")
    (coordinator,) = spec["containers"]
    args = coordinator["args"]
    assert "--db=/var/lib/torch-hang-watchdog/incidents.db" in args
    assert "--health-listen=0.0.0.0:29453" in args
    assert {"name": "incidents", "mountPath": "/var/lib/torch-hang-watchdog"} in (
        coordinator["volumeMounts"])
    (incidents,) = [v for v in spec["volumes"] if v["name"] == "incidents"]
    pvc = one(manifests, "PersistentVolumeClaim")
    assert incidents["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert coordinator[probe]["grpc"]["port"] == 29453
    assert coordinator["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    secrets = {d["metadata"]["name"]: d for d in manifests if d["kind"] == "Secret"}
    (credentials,) = [v for v in spec["volumes"] if v["name"] == "credentials"]
    assert set(secrets[credentials["secret"]["secretName"]]["data"]) == {
        "token", "tls.crt", "tls.key"}
    (agent_credentials,) = [v for v in pod(manifests, "Job")["volumes"]
                            if v["name"] == "credentials"]
    assert set(secrets[agent_credentials["secret"]["secretName"]]["data"]) == {
        "token", "ca.crt"}  # never the coordinator's key


def test_only_agents_and_readers_reach_the_coordinator(manifests: list[Doc]) -> None:
    policy = one(manifests, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    admitted = {peer["podSelector"]["matchLabels"]["torch-hang-watchdog/role"]:
                sorted(port["port"] for port in rule["ports"])
                for rule in policy["ingress"] for peer in rule["from"]}
    assert admitted == {"agent": [29450], "reader": [29450, 29451]}
    labels = one(manifests, "Job")["spec"]["template"]["metadata"]["labels"]
    assert labels["torch-hang-watchdog/role"] == "agent"
