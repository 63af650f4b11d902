"""Security tests: each attack of issue 11 run by an unprivileged user (`nobody`, through
setpriv) against real daemons running as root. The run stops at once, with the fix, when this
machine cannot do that: not root, no setpriv, py-spy missing, or `nobody` unable to run this
interpreter and import the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from _attack import AS_NOBODY, REPO, clean_env
from _harness import machine_share, preflight  # noqa: F401 (a fixture every test takes)

from watchdog.errors import WatchdogError


def _nobody_runs_the_package() -> str:
    if os.geteuid() != 0:
        return "they run as root (CI does): the attacker is `nobody`, the daemons root"
    if shutil.which("setpriv") is None:
        return "they need setpriv (util-linux) to drop to `nobody`"
    probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import watchdog"],
                           capture_output=True, text=True, env=clean_env(), cwd="/")
    if probe.returncode != 0:
        return (f"`nobody` must be able to run {sys.executable} and read {REPO} (clone it where "
                f"every user may read it): {probe.stderr.strip()[-300:]}")
    return ""


def pytest_configure(config: pytest.Config) -> None:
    problem = _nobody_runs_the_package()
    try:
        preflight()
    except WatchdogError as e:
        problem = problem or f"they need py-spy and ptrace: {e}"
    if problem:
        pytest.exit(f"security tests: {problem}", returncode=4)
