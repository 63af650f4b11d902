"""deploy/container/Containerfile built by podman on a local base image (its BASE build
argument), and run: its `watchdog` is the checkout's, it takes a PostgreSQL URL (the postgres
extra is in it), and the coordinator runs from it as the image's own non-root user. Then the
example training pod's shape as a podman pod: the trainer and the agent sidecar share the pod's
PID namespace and /dev/shm, the agent with the manifests' user and capabilities and its token
from a file mounted where the manifests mount it; a hang in the trainer is named with its
stack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemons import until_verdict
from tests.helpers.harness import WATCHDOG
from tests.helpers.image import RUN, TRAINER_USER, build_images, podman, podman_output
from tests.helpers.secured import TOKEN, Certs

IMAGE_USER = 65532  # the Containerfile's USER


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheels")


@pytest.fixture(scope="module")
def images(wheels: Path) -> tuple[str, str]:
    """The image and the trainer's image."""
    return build_images(wheels)


@pytest.fixture(scope="module")
def image(images: tuple[str, str]) -> str:
    return images[0]


def test_the_images_watchdog_is_the_checkouts(image: str) -> None:
    here = subprocess.run([*WATCHDOG, "--version"], capture_output=True, text=True, check=True)
    assert podman("run", "--rm", *RUN, image, "--version") == here.stdout


def test_the_image_has_the_postgres_extra(image: str) -> None:
    """A URL whose server is not there is a failure to reach it (1), not a usage error (2)
    saying that the extra is missing."""
    out = subprocess.run(["podman", "run", "--rm", *RUN, image, "incidents", "list", "--db",
                          "postgresql://nobody@127.0.0.1:1/incidents"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "cannot reach the incident database" in out.stderr, out


def test_the_coordinator_runs_from_the_image_as_its_non_root_user(image: str) -> None:
    name = f"thw-coordinator-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, *RUN, image, "coordinator", "--listen",
           "127.0.0.1:29450", "--db", "/tmp/incidents.db")
    try:
        deadline = time.monotonic() + 60
        while "listening on 127.0.0.1:29450" not in (logs := podman_output("logs", name)):
            assert time.monotonic() < deadline, logs
            time.sleep(0.5)
        pid = podman("inspect", "--format", "{{.State.Pid}}", name).strip()
        uids = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("Uid:"))
        assert uids.split()[1:] == [str(IMAGE_USER)] * 4, uids  # real, effective, saved, fs
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


MOUNT = "/var/run/secrets/torch-hang-watchdog"  # where the manifests mount the credentials
CLIENT = ["--coordinator=localhost:29450", f"--token-file={MOUNT}/token",
          f"--tls-ca={MOUNT}/ca.crt"]
JOB_ID = "pod-job"


def secret(directory: Path, owner: int, **files: str) -> Path:
    """A Secret's volume as the kubelet makes it (mode 0400, owned by the container's user):
    the token and the named files (ca -> ca.crt, tls_crt -> tls.crt)."""
    directory.mkdir()
    (directory / "token").write_text(TOKEN + "\n")
    for key, source in files.items():
        shutil.copy(source, directory / (key.replace("_", ".") + ("" if "_" in key else ".crt")))
    for path in [directory, *directory.iterdir()]:
        os.chown(path, owner, owner)
        path.chmod(0o500 if path.is_dir() else 0o400)
    return directory


@pytest.fixture(scope="module")
def pod(images: tuple[str, str], wheels: Path, certs: Certs) -> Iterator[str]:
    """The pod: the agent sidecar, the trainer's job (hung), and the coordinator in a container
    of its own beside them (in the pod, so that the certificate's `localhost` names it)."""
    image, trainer = images
    secrets = {"agent": secret(wheels / "agent", 0, ca=certs.ca),
               "coordinator": secret(wheels / "coordinator", IMAGE_USER, tls_crt=certs.server_cert,
                                     tls_key=certs.server_key, ca=certs.ca)}
    name = f"thw-pod-{uuid.uuid4().hex[:8]}"
    # The agent starts first, as a native sidecar does, and holds the pod's namespaces.
    share = [f"--{ns}=container:{name}-agent" for ns in ("pid", "ipc", "network", "uts")]
    try:
        podman("run", "-d", "--name", f"{name}-agent", "--hostname", name, "--ipc", "shareable",
               *RUN, "-v", f"{secrets['agent']}:{MOUNT}:ro", "--user", "0", "--cap-drop", "ALL",
               "--cap-add", "SYS_PTRACE,SETUID,SETGID", "--security-opt", "no-new-privileges",
               "--read-only", image, "agent", *CLIENT, f"--node-name={name}")
        podman("run", "-d", "--name", f"{name}-coordinator", *RUN, share[2],
               "-v", f"{secrets['coordinator']}:{MOUNT}:ro", image,
               "coordinator", "--listen=127.0.0.1:29450", f"--token-file={MOUNT}/token",
               f"--tls-cert={MOUNT}/tls.crt", f"--tls-key={MOUNT}/tls.key", "--db=/tmp/i.db")
        podman("run", "-d", "--name", f"{name}-trainer", *RUN, *share,
               "--user", TRAINER_USER, "--cap-drop", "ALL", "-e", f"WATCHDOG_JOB_ID={JOB_ID}",
               "-e", "OMP_NUM_THREADS=1", trainer, "launch", "--", "python", "-m",
               "torch.distributed.run", "--nproc_per_node=2", "-m", "watchdog.demo.train",
               "--fault", "data_stall", "--fault-rank", "1", "--fault-step", "4")
        yield name
    finally:
        for role in ("trainer", "coordinator", "agent"):
            podman("rm", "-f", "-t", "0", f"{name}-{role}", check=False)


def pod_status(pod: str) -> dict[str, Any] | None:
    """`watchdog status --json` in the coordinator's container; None while it answers no JSON."""
    out = podman("exec", f"{pod}-coordinator", "watchdog", "status", "--json", *CLIENT,
                 check=False)
    return json.loads(out) if out.startswith("{") else None


def test_a_hang_in_the_trainer_is_named_by_the_sidecar(pod: str) -> None:
    verdict = until_verdict(lambda: pod_status(pod), JOB_ID)["verdict"]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("MISSING_RANKS", [1]), verdict
    culprit = next(r for r in verdict["ranks"] if r["rank"] == 1)
    assert "read_sample_from_storage" in [f["function"] for f in culprit["stack"]], culprit
    assert culprit["host"] == pod, culprit  # the agent's node name: one pod, one node
    # Steps come from the rank's beacon alone: the sidecar reads the trainer's /dev/shm.
    assert isinstance(culprit["step"], int) and culprit["step"] >= 3, culprit
