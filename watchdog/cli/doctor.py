"""`watchdog doctor`: preflight checks of this node, each with a fix when it fails."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from watchdog import env as _env
from watchdog.beacondir import user_dir
from watchdog.errors import BeaconError, ExitCode, PySpyMissingError

OK, WARN, FAIL = "ok", "warn", "FAIL"
CAP_SYS_PTRACE = 19
Check = tuple[str, str]  # (level, message)


def check_install() -> Check:
    package_dir = Path(__file__).resolve().parents[1]
    try:
        importlib.metadata.distribution("watchdog")
        clash = True
    except importlib.metadata.PackageNotFoundError:
        clash = (package_dir / "observers").is_dir()
    if clash:
        return FAIL, ("PyPI's filesystem-events package `watchdog` is installed here and shares "
                      "the import name `watchdog`. Fix: use a separate virtualenv, or `pip "
                      "uninstall watchdog && pip install --force-reinstall torch-hang-watchdog`")
    return OK, f"torch-hang-watchdog imported from {package_dir}"


def check_systemd_names() -> Check:
    unit_dirs = ("/lib/systemd/system", "/etc/systemd/system")
    if any(Path(d, "watchdog.service").exists() for d in unit_dirs):
        return WARN, ("watchdog.service on this host is Debian's hardware watchdog, not this "
                      "tool; "
                      "ours are torch-hang-watchdog-agent.service and -coordinator.service")
    return OK, "no systemd unit name clash"


def check_py_spy() -> Check:
    from agent.stacks import find_py_spy

    try:
        path = find_py_spy()
    except PySpyMissingError as e:
        return FAIL, str(e)
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    return OK, f"{out.stdout.strip() or 'py-spy'} at {path}"


def _has_cap_sys_ptrace() -> bool:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    return False


def check_ptrace() -> Check:
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        scope = 0
    privileged = os.geteuid() == 0 or _has_cap_sys_ptrace()
    if scope >= 3:
        return FAIL, ("kernel.yama.ptrace_scope=3 forbids all attaching: py-spy cannot take "
                      "stacks. Fix: set it to 1 or lower (needs a reboot once at 3)")
    if privileged:
        return OK, f"can attach to workers (ptrace_scope={scope}, CAP_SYS_PTRACE or root)"
    if scope == 0:
        return OK, "can attach to workers of the same user (ptrace_scope=0)"
    return WARN, (f"ptrace_scope={scope} and no CAP_SYS_PTRACE: stacks will fail. Fix: run the "
                  "agent as root, grant CAP_SYS_PTRACE, or `sysctl kernel.yama.ptrace_scope=0`")


def check_torch() -> Check:
    if importlib.util.find_spec("torch") is None:
        return WARN, "torch is not importable here: fine for a coordinator, not for training"
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return FAIL, f"torch {torch.__version__} was built without torch.distributed"
    flight_recorder = hasattr(torch._C._distributed_c10d, "_dump_fr_trace_json")
    return OK, (f"torch {torch.__version__}: Python collectives patched, DDP covered by counting "
                f"its forwards, Flight Recorder {'available' if flight_recorder else 'absent'} "
                "(not used by default: it costs about 16% of a small DDP step on gloo)")


def check_beacon_dir() -> Check:
    """This user can make their own beacon directory; and the base is root's, made at boot."""
    base = _env.beacon_dir()
    try:
        fd, directory = user_dir(base)
    except BeaconError as e:
        return FAIL, f"{e.args[0]}. Fix: {e.hint}"
    base_owner = os.lstat(base).st_uid
    os.close(fd)
    free_mb = shutil.disk_usage(directory).free // 2**20
    where = f"beacons go to {directory} ({free_mb} MiB free)"
    if free_mb < 16:
        return WARN, f"{where}: a full /dev/shm leaves the hook off"
    if base == _env.DEFAULT_BEACON_DIR and base_owner != 0:
        return WARN, (f"{where}; {base} was made by uid {base_owner}, not root: it can keep "
                      "other users' hooks off. Fix: install deploy/systemd/"
                      "torch-hang-watchdog.tmpfiles.conf")
    return OK, where


CHECKS: list[Callable[[], Check]] = [check_install, check_systemd_names, check_py_spy,
                                     check_ptrace, check_torch, check_beacon_dir]


def run_doctor(out: TextIO) -> int:
    failed = False
    for check in CHECKS:
        try:
            level, message = check()
        except Exception as e:  # a broken check is itself a finding, not a crash
            level, message = FAIL, f"{check.__name__} could not run: {e}"
        failed |= level == FAIL
        out.write(f"{level:>4}  {message}\n")
    return ExitCode.ERROR if failed else ExitCode.OK


class DoctorCommand:
    name = "doctor"
    help = "preflight checks: ptrace, py-spy, torch, names"
    description = ("Checks that this machine can watch a job: ptrace permission, py-spy, torch and "
                   "its Flight Recorder, the beacon directory, the environment and name clashes.")
    example = "watchdog doctor"
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        """No options: every check runs."""

    def run(self, args: argparse.Namespace) -> int:
        return run_doctor(sys.stdout)
