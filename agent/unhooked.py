"""Torchrun workers without the hook, found in /proc (stacks-only mode): taken when a worker
and its torchrun run as one user, so attaching to it or reading its files as that user does
nothing its owner could not; and when its environment names this agent's beacon directory (or
none: the default), as a hooked worker's beacon would be routed, so that a job pointed at
another agent (another container's, a `watchdog run`'s) is that agent's alone."""

from __future__ import annotations

import os
from collections.abc import Container

from agent import procfs, verify
from agent.discover import impossible, nccl_debug_file
from agent.worker import Worker
from watchdog import beacon
from watchdog import env as _env

SCAN_S = 2.0  # how often the table looks through /proc for them


def find(proc: str, boot: float, known: Container[int], beacon_dir: str) -> list[Worker]:
    """The unhooked torchrun workers of `beacon_dir`'s agent running now whose pids are not
    `known`."""
    found = []
    for pid in procfs.list_pids(proc):
        if pid not in known:
            worker = unhooked_worker(pid, proc, boot, beacon_dir)
            if worker is not None:
                found.append(worker)
    return found


def unhooked_worker(pid: int, proc: str, boot: float, beacon_dir: str) -> Worker | None:
    """The process as a torchrun worker without a hook, or None where it is not one (or not
    one the agent of `beacon_dir` may take)."""
    stat = procfs.read_stat(pid, proc)
    if stat is None or stat.gone or not procfs.is_torchrun(procfs.read_cmdline(stat.ppid, proc)):
        return None
    owner = verify.credentials(pid, proc)
    launcher = verify.credentials(stat.ppid, proc)
    if owner is None or launcher is None or launcher.uid != owner.uid:
        return None
    env = procfs.read_environ(pid, proc)
    if env is None or not _env.is_torchrun_worker(env) or env.get(_env.AUTOINSTALL) == "1":
        return None  # not a worker, or a hooked one: its beacon (here or elsewhere) tells
    if os.path.normpath(_env.beacon_dir(env)) != os.path.normpath(beacon_dir):
        return None
    identity = beacon.Identity(
        _env.job_id(env), _env.int_env(env, "RANK", 0), _env.int_env(env, "LOCAL_RANK", 0),
        _env.int_env(env, "WORLD_SIZE", 1), _env.short_hostname(), pid,
        procfs.start_time(stat, boot), _env.int_env(env, _env.ATTEMPT, 0))
    if impossible(identity):
        return None
    worker = Worker(identity, stat.start_ticks, nccl_debug_file=nccl_debug_file(env, pid),
                    master_addr=env.get("MASTER_ADDR", ""), owner=owner)
    worker.watch_oom(proc)
    return worker
