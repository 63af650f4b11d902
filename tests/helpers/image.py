"""The project's image, built with podman from deploy/container/Containerfile on a local base (no
container registry is reachable from CI): a Debian 12 root with Python 3.11, imported once per
machine and kept in podman's store under a tag keyed by what goes into it. Containers run with
runc (crun refuses this VM's hybrid cgroups) and ulimits within the VM's hard limits (RUN): a
pod's infra container takes podman's defaults, which exceed them, so a pod's namespaces are
shared here by joining the first container's."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.sysroot import CACHE, REPO, dependencies, extra, torch

PACKAGES = "python3,python3-venv,python3-pip,python-is-python3"
IMAGE = "localhost/torch-hang-watchdog:system-test"
TRAINER = "localhost/torch-hang-watchdog-trainer:system-test"
TRAINER_USER = "1000:1000"  # the example manifests' trainer
# A training image as the Containerfile's head describes one: the same wheel beside torch.
TRAINER_FILE = f"""FROM {IMAGE}
USER 0
RUN PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels-in pip install --no-cache-dir {{torch}}
USER {TRAINER_USER}
"""
CONTAINERFILE = REPO / "deploy" / "container" / "Containerfile"
RUN = ["--runtime", "runc", "--ulimit", "nproc=1024:1024", "--ulimit", "nofile=1024:1024"]
BUILD_TIMEOUT_S = 900


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    out = run_podman(args, timeout, subprocess.PIPE)
    assert out.returncode == 0 or not check, f"podman {args[:2]}: {out.stdout}{out.stderr}"
    return out.stdout


def podman_output(*args: str) -> str:
    """stdout and stderr together (`logs` replays each container stream on its own)."""
    return run_podman(args, 60, subprocess.STDOUT).stdout


def run_podman(args: tuple[str, ...], timeout: float,
               stderr: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], stdout=subprocess.PIPE, stderr=stderr, text=True,
                          timeout=timeout)


def base_image() -> str:
    """What python:3.11-slim-bookworm offers the Containerfile (python, pip, venv), from
    Debian's packages: imported on the first run, found in podman's store after that."""
    key = hashlib.sha256((PACKAGES + Path(__file__).read_text()).encode()).hexdigest()[:16]
    tag = f"localhost/torch-hang-watchdog-test-base:{key}"
    if podman("images", "-q", tag):
        return tag
    CACHE.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=CACHE, prefix="base-"))
    try:
        tarball = scratch / "base.tar"
        subprocess.run(["mmdebstrap", "-q", "--variant=minbase", f"--include={PACKAGES}",
                        "bookworm", str(tarball)], check=True, capture_output=True,
                       timeout=BUILD_TIMEOUT_S)
        podman("import", str(tarball), tag, timeout=BUILD_TIMEOUT_S)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return tag


def wheels_of(wheels: Path, *requirements: str) -> None:
    """`requirements` and what they need, as wheels from this machine's pip, into `wheels`."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels),
                    *requirements], check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)


def build_image(wheels: Path) -> str:
    """The checkout's image on the local base, offline: pip finds what it needs (setuptools to
    build, the wheel's dependencies to install) in `wheels`, made here from this machine's pip.
    podman's layer cache makes a rebuild of unchanged sources quick."""
    wheels_of(wheels, "setuptools>=68", *dependencies(), *extra("postgres"))
    podman("build", *RUN, "-f", str(CONTAINERFILE), "--build-arg", f"BASE={base_image()}",
           "-v", f"{wheels}:/wheels-in:ro", "--build-arg", "PIP_NO_INDEX=1",
           "--build-arg", "PIP_FIND_LINKS=/wheels-in", "-t", IMAGE, str(REPO),
           timeout=BUILD_TIMEOUT_S)
    return IMAGE


def build_trainer(wheels: Path) -> str:
    """The image with torch added, run as the manifests' trainer user (build_image first)."""
    wheels_of(wheels, torch())
    context = wheels / "trainer"
    context.mkdir(exist_ok=True)
    (context / "Containerfile").write_text(TRAINER_FILE.format(torch=torch()))
    podman("build", *RUN, "-v", f"{wheels}:/wheels-in:ro", "-t", TRAINER, str(context),
           timeout=BUILD_TIMEOUT_S)
    return TRAINER


def build_images(wheels: Path) -> tuple[str, str]:
    """The image and the trainer's; the ones they replace are removed (a trainer's torch layer
    is 700 MB), the build stages kept: they are podman's cache for the next build."""
    old = {tag: image_id(tag) for tag in (TRAINER, IMAGE)}  # a child before its parent
    built = build_image(wheels), build_trainer(wheels)
    for tag, was in old.items():
        if was and was != image_id(tag):
            podman("rmi", was, check=False)
    base = base_image()
    for stale in podman("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter",
                        f"reference={base.rsplit(':', 1)[0]}").split():
        if stale != base:  # an older recipe's
            podman("rmi", stale, check=False)
    return built


def image_id(tag: str) -> str:
    return podman("images", "-q", tag).strip()
