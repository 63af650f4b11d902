"""`watchdog check` on this node: a healthy run through init, all_reduce, barrier and destroy,
and the settings that stop it before it starts (real torchrun, gloo, the embedded watchdog)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.helpers.harness import JOB_TIMEOUT_S, WATCHDOG, job_env
from watchdog.cli.demo import free_port


def check(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WATCHDOG, "check", *args], env={**job_env(tmp_path), **env},
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)


def test_a_healthy_node_passes_every_step(tmp_path: Path) -> None:
    run = check(tmp_path, "--nproc", "2", MASTER_PORT=str(free_port()))
    assert run.returncode == 0, run.stdout + run.stderr
    for step in ("init_process_group", "all_reduce", "barrier", "destroy_process_group"):
        assert any(line.startswith(step) and " 2/2 " in line
                   for line in run.stdout.splitlines()), run.stdout
    assert run.stdout.rstrip().endswith("watchdog check: passed")


def test_a_master_port_in_use_fails_before_the_job(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = check(tmp_path, "--", f"--master_port={port}")
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"FAIL  MASTER_PORT={port} is already in use on this host" in run.stdout
    assert "PORT_IN_USE: the rendezvous port is already taken" in run.stdout
    assert "FAILED before starting the job" in run.stdout


def test_a_master_addr_of_another_host_fails_before_the_job(tmp_path: Path) -> None:
    run = check(tmp_path, MASTER_ADDR="192.0.2.1", MASTER_PORT=str(free_port()))  # TEST-NET-1
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL  MASTER_ADDR=192.0.2.1 (192.0.2.1) is not an address of this host" in (
        run.stdout)
    assert "CONNECT_FAILED: could not connect to a peer or to the master" in run.stdout
