"""Starting a job with the hook injected (CLI process): the environment for `run` and `launch`."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from watchdog import env as _env
from watchdog.errors import UsageError

BOOT_DIR = str(Path(__file__).resolve().parents[1] / "hook" / "boot")
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def new_job_id(cmd: Sequence[str]) -> str:
    """'<script>-<date>-<time>-<random>': the training script's name where the command has one."""
    scripts = [Path(arg).stem for arg in cmd if arg.endswith(".py")]
    name = scripts[0] if scripts else Path(cmd[0]).name if cmd else "job"
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def hook_env(base: Mapping[str, str], beacon_dir: str, job_id: str | None) -> dict[str, str]:
    """`base` plus what makes every Python worker install the hook at start-up."""
    env = dict(base)
    # The boot dir's sitecustomize installs the hook; the package's parent makes `watchdog`
    # importable even where the job runs another interpreter of the same environment.
    paths = [BOOT_DIR, PACKAGE_PARENT, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env[_env.AUTOINSTALL] = "1"
    env[_env.BEACON_DIR] = beacon_dir
    env.pop(_env.HOOK_PID, None)
    env.pop("WATCHDOG_TOKEN", None)  # the coordinator's secret is none of the job's business
    if job_id:
        env[_env.JOB_ID] = job_id
    return env


def check_command(cmd: Sequence[str]) -> list[str]:
    """The command after `--`, or a UsageError saying how to pass one."""
    args = list(cmd[1:] if cmd and cmd[0] == "--" else cmd)
    if not args:
        raise UsageError("no command to run",
                         hint="put the job after --, e.g. watchdog run -- torchrun train.py")
    return args


def exec_with_hook(cmd: Sequence[str]) -> None:
    """`watchdog launch`: replace this process with `cmd`, hook injected, no daemon of our own."""
    args = check_command(cmd)
    # The directory is the hook's to make, safely (watchdog.beacondir), in each rank.
    env = hook_env(os.environ, _env.beacon_dir(), os.environ.get(_env.JOB_ID))
    try:
        os.execvpe(args[0], args, env)
    except OSError as e:
        raise cannot_run(args[0], e) from e


def cannot_run(program: str, error: OSError) -> UsageError:
    """The command after `--` could not be started (not found, not executable, a directory)."""
    return UsageError(f"cannot run {program}: {error.strerror}",
                      hint="check the command name and your PATH; a script needs `chmod +x`, or "
                           "its interpreter before it (python train.py)")
