"""What this machine must offer a tier before its tests run: each check returns the message that
says what to fix, or "" when the tier can run (tests/conftest.py stops the run on a message)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

from tests.helpers import everyone
from tests.helpers.attack import clean_env
from tests.helpers.harness import preflight
from watchdog.errors import PtraceDeniedError, PySpyMissingError, WatchdogError


def integration() -> str:
    try:
        preflight()
    except (PySpyMissingError, PtraceDeniedError, WatchdogError) as e:
        return f"integration tests need py-spy and ptrace: {e}"
    return ""


def _nobody_runs_the_package() -> str:
    if os.geteuid() != 0:
        return "they run as root (CI does): the attacker is `nobody`, the daemons root"
    if shutil.which("setpriv") is None:
        return "they need setpriv (util-linux) to drop to `nobody`"
    try:
        probe = subprocess.run([*everyone.AS_NOBODY, everyone.python(), "-c", "import watchdog"],
                               capture_output=True, text=True, env=clean_env(), cwd="/")
    except everyone.Unprepared as e:
        return f"`nobody` runs a copy of the package, on an interpreter it can run: {e}"
    if probe.returncode != 0:
        return (f"`nobody` must be able to run the copy of the package in "
                f"{everyone.checkout()}: {probe.stderr.strip()[-300:]}")
    return ""


def security() -> str:
    problem = _nobody_runs_the_package()
    try:
        preflight()
    except WatchdogError as e:
        problem = problem or f"they need py-spy and ptrace: {e}"
    return f"security tests: {problem}" if problem else ""


BY_TIER: dict[str, Callable[[], str]] = {"integration": integration, "security": security}
