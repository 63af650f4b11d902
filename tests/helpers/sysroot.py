"""A Debian 12 root for the system tier, as an operator's node would have it: systemd, Python
3.11, and /opt/torch-hang-watchdog holding the project's dependencies and torch (for a job), but
not the project itself, which each run installs from the checkout's own wheel. Built once per
machine under CACHE, keyed by what goes into it, since it takes minutes (Debian's packages from
its registry; the Python wheels from this machine's pip, never torch from the internet)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomllib

REPO = Path(__file__).resolve().parents[2]
CACHE = Path("/var/cache/torch-hang-watchdog-tests")
PACKAGES = "systemd,systemd-sysv,dbus,python3,python3-venv,procps,passwd"
VENV = "/opt/torch-hang-watchdog"
USER = "trainer"  # the ordinary user whose job the services watch
BUILD_TIMEOUT_S = 900
HOSTNAME = "node-a"
# mmdebstrap writes none: without it `localhost` does not resolve, and torchrun needs it.
HOSTS = f"127.0.0.1 localhost\\n127.0.1.1 {HOSTNAME}\\n::1 localhost ip6-localhost\\n"


def _project() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def dependencies() -> list[str]:
    """The wheel's own dependencies."""
    return list(_project()["dependencies"])


def extra(name: str) -> list[str]:
    """What the wheel's extra `name` adds."""
    return list(_project()["optional-dependencies"][name])


def torch() -> str:
    """The torch this project is tested on (for a job)."""
    tested = _project()["optional-dependencies"]["test"]
    return next(str(r) for r in tested if r.startswith("torch=="))


def requirements() -> list[str]:
    return [*dependencies(), torch()]


def cache_key() -> str:
    """What goes in: the packages, the requirements and this recipe."""
    text = "\n".join([PACKAGES, *requirements(), Path(__file__).read_text()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def nspawn(root: Path, *args: str) -> list[str]:
    """systemd-nspawn on `root` where no systemd runs the host: nothing to register with."""
    return ["systemd-nspawn", "-q", "-D", str(root), "--register=no", "--keep-unit", *args]


def debian_root() -> Path:
    """The cached root, built first when this machine has none for this key."""
    root = CACHE / f"debian-{cache_key()}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits for the first one's build
        if not root.is_dir():
            _build(root)
    return root


def _build(root: Path) -> None:
    """Into a scratch directory renamed at the end, so that a build cut short is never used."""
    scratch = root.with_name(root.name + ".partial")
    wheels = root.with_name(root.name + ".wheels")
    for path in (scratch, wheels):
        shutil.rmtree(path, ignore_errors=True)
    try:
        _run(["mmdebstrap", "-q", "--variant=minbase", f"--include={PACKAGES}", "bookworm",
              str(scratch)])
        wheels.mkdir()
        (wheels / "requirements.txt").write_text("\n".join(requirements()) + "\n")
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), "-r",
              str(wheels / "requirements.txt")])
        _run(nspawn(scratch, f"--bind-ro={wheels}:/wheels", "/bin/sh", "-c",
                    f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --no-index "
                    f"--find-links /wheels -r /wheels/requirements.txt && useradd -m {USER} "
                    f"&& echo {HOSTNAME} > /etc/hostname && printf '{HOSTS}' > /etc/hosts"))
        for stale in CACHE.glob("debian-" + "?" * 16):  # other keys' roots: a gigabyte each
            shutil.rmtree(stale, ignore_errors=True)
        scratch.rename(root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(wheels, ignore_errors=True)


def _run(argv: list[str]) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert out.returncode == 0, f"{argv[:3]} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"


def project_wheel(into: Path) -> Path:
    """The checkout's own wheel, built from its sources alone."""
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "--wheel-dir", str(into), str(REPO)])
    (wheel,) = into.glob("torch_hang_watchdog-*.whl")
    return wheel
