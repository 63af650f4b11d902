"""Which torchrun workers without the hook an agent takes (agent/unhooked.py), from real
processes: a launcher named torchrun and its worker, with torchrun's variables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent import procfs, unhooked
from watchdog import env as _env

WORKER = "import time; print('ready', flush=True); time.sleep(60)"
# Stands for torchrun: starts one worker with torchrun's variables, says its pid, waits for it.
LAUNCHER = f"""import os, subprocess, sys
env = {{**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}}
worker = subprocess.Popen([sys.executable, "-c", {WORKER!r}], env=env, stdout=subprocess.PIPE,
                          text=True)
worker.stdout.readline()
print(worker.pid, flush=True)
worker.wait()
"""


@contextmanager
def worker_pid(tmp_path: Path, env: dict[str, str]) -> Iterator[int]:
    launcher = tmp_path / "torchrun"
    launcher.write_text(LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(launcher)], env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its worker
        proc.wait()


@pytest.fixture
def bare_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("WATCHDOG_")}


def taken(pid: int, beacon_dir: str) -> bool:
    return pid in {w.identity.pid for w in unhooked.find(
        "/proc", procfs.boot_time(), set(), beacon_dir)}


def test_an_agent_takes_the_workers_whose_environment_names_its_beacon_directory(
        tmp_path: Path, bare_env: dict[str, str]) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    with worker_pid(tmp_path, {**bare_env, _env.BEACON_DIR: f"{mine}/"}) as pid:
        assert taken(pid, str(mine))
        assert not taken(pid, str(other))  # pointed at another agent: left to it
        assert not taken(pid, _env.DEFAULT_BEACON_DIR)


def test_a_worker_that_names_no_beacon_directory_is_the_default_directorys_agents(
        tmp_path: Path, bare_env: dict[str, str]) -> None:
    with worker_pid(tmp_path, bare_env) as pid:
        assert taken(pid, _env.DEFAULT_BEACON_DIR)
        assert not taken(pid, str(tmp_path / "beacons"))
