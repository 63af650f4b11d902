"""The package as every user may run it. Some tests run Python as another user (the security
tests' attackers as `nobody`, a user's own `watchdog run`), who may be unable to read the
checkout or to run its virtualenv's interpreter: a clone in root's 0700 home, or in a user's
0750 one tested through sudo. So, once per test session, a world-readable temporary directory
gets a copy of the package and of the attackers' scripts, and a virtualenv with the package's
dependencies on an interpreter of this Python version that `nobody` can run; the user's own
directories keep their modes. tests/conftest.py prepares it before xdist starts its workers,
which find it through the environment; a bench that needs it makes its own."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
COPIED = ("watchdog", "agent", "tests/security")  # the package, and the attackers' scripts
PACKAGE = "torch-hang-watchdog"
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
# Prints the version of an interpreter that runs from where it says: a kernel that lets
# `nobody` exec a file it cannot reach may run another one under that name.
_PROBE = "import os, sys; os.stat(sys.executable); print('%d.%d' % sys.version_info[:2])"
_MADE = "WATCHDOG_TESTS_EVERYONE"  # the directory, once made, for the processes started after


class Unprepared(Exception):
    """No interpreter of this version that `nobody` can run: the message says what to do."""


def checkout() -> Path:
    """The copy of the package and the attackers' scripts (tests/security)."""
    return _directory() / "checkout"


def python() -> str:
    """An interpreter every user may run, that imports the copied package and its
    dependencies."""
    return str(_directory() / "venv" / "bin" / "python")


def attacker(script: str) -> str:
    """The copy of tests/security/`script`."""
    return str(checkout() / "tests" / "security" / script)


def prepare() -> None:
    """Make the directory now, for this process and the ones it starts (xdist's workers)."""
    _directory()


@functools.cache
def _directory() -> Path:
    made = os.environ.get(_MADE)
    if made:
        return Path(made)
    top = Path(tempfile.mkdtemp(prefix="torch-hang-watchdog-everyone-"))
    atexit.register(shutil.rmtree, top, ignore_errors=True)
    interpreter = _interpreter()
    for path in COPIED:
        shutil.copytree(REPO / path, top / "checkout" / path,
                        ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([interpreter, "-m", "venv", "--without-pip", str(top / "venv")], check=True)
    site = top / "venv" / "lib" / f"python{VERSION}" / "site-packages"
    for dependency in _dependencies(metadata.distribution(PACKAGE)):
        _copy(dependency, site)
    (site / "torch_hang_watchdog.pth").write_text(f"{top / 'checkout'}\n")
    _open_to_all(top)
    os.environ[_MADE] = str(top)
    return top


def _interpreter() -> str:
    """The interpreter this virtualenv was made from, or the system's of this version: the
    first that `nobody` can run."""
    candidates = (str(Path(sys.base_prefix) / "bin" / f"python{VERSION}"),
                  f"/usr/bin/python{VERSION}", f"/usr/local/bin/python{VERSION}")
    for candidate in dict.fromkeys(candidates):
        probe = subprocess.run([*AS_NOBODY, candidate, "-c", _PROBE], capture_output=True,
                               text=True, cwd="/")
        if probe.returncode == 0 and probe.stdout.strip() == VERSION:
            return candidate
    raise Unprepared(f"`nobody` can run none of {', '.join(candidates)}: install "
                     f"python{VERSION} from the distribution")


def _dependencies(package: metadata.Distribution) -> list[metadata.Distribution]:
    """What the package needs to run: its requirements, theirs, and so on (no extra)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [package]
    while todo:
        for text in todo.pop().requires or ():
            requirement = Requirement(text)
            name = canonicalize_name(requirement.name)
            if name in found or (requirement.marker is not None
                                 and not requirement.marker.evaluate({"extra": ""})):
                continue
            found[name] = metadata.distribution(name)
            todo.append(found[name])
    return list(found.values())


def _copy(distribution: metadata.Distribution, site: Path) -> None:
    """Its files that live in site-packages (not its scripts)."""
    for file in distribution.files or ():
        relative = os.path.normpath(file)
        source = Path(distribution.locate_file(file))
        if relative.startswith("..") or not source.is_file():
            continue
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, site / relative)


def _open_to_all(top: Path) -> None:
    """Every user may read and enter it, whatever the umask and the checkout's modes; the
    links (the virtualenv's interpreter) are left alone."""
    for parent, _, files in os.walk(top):
        os.chmod(parent, 0o755)
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)
