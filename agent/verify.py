"""Is this process the worker its beacon says it is? (agent process, reading /proc as root)

A root agent attaches py-spy to workers, reads their files and may signal them: a user must not
be able to point it at a process they could not touch themselves. A beacon names its writer's
pid, and anyone can write a beacon, so the pid is only believed when
- every uid of the process (real, effective, saved, file system) is the uid that owns the
  beacon (a setuid process, or another user's, never passes),
- the process started before the beacon was made (a pid reused by a newer process fails), and
- the process holds the beacon mapped or open (/proc/PID/maps, /proc/PID/fd): it really is the
  beacon's writer.
Only then is its environment read, and its RANK and WORLD_SIZE, where it has them, must agree
with the beacon. A rank torch.multiprocessing.spawn started has none: it became its rank when it
called init_process_group, and it already proved to be the beacon's writer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent import procfs

START_MARGIN_S = 2.0  # clock ticks and the beacon's own clock read differ by this much at most


@dataclass(frozen=True)
class Credentials:
    """Who a process runs as: its uid, gid and supplementary groups."""

    uid: int
    gid: int
    groups: tuple[int, ...]


def credentials(pid: int, proc: str = "/proc") -> Credentials | None:
    """The process's credentials; None when it is gone, or when its uids or gids differ from
    each other (a setuid or setgid program: not one user's worker)."""
    fields: dict[str, list[int]] = {}
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f:
                key, _, value = line.decode("ascii", "replace").partition(":")
                if key in ("Uid", "Gid", "Groups"):
                    fields[key] = [int(v) for v in value.split()]
    except (OSError, ValueError):
        return None
    uids, gids = fields.get("Uid", []), fields.get("Gid", [])
    if len(set(uids)) != 1 or len(set(gids)) != 1:
        return None
    return Credentials(uids[0], gids[0], tuple(fields.get("Groups", [])))


def holds_file(pid: int, st: os.stat_result, proc: str = "/proc") -> bool:
    """Whether the process maps the file `st` describes, or has it open."""
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}".encode()
    inode = str(st.st_ino).encode()
    try:
        with open(f"{proc}/{pid}/maps", "rb") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) >= 5 and fields[4] == inode and fields[3] == device:
                    return True
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            linked = os.stat(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            continue
        if (linked.st_dev, linked.st_ino) == (st.st_dev, st.st_ino):
            return True
    return False


def refuse_beacon_writer(pid: int, beacon_stat: os.stat_result, created_at: float, boot: float,
                         proc: str = "/proc") -> str:
    """Why process `pid` is not the writer of the beacon `beacon_stat` describes (made at
    `created_at`, by its own account); "" when it is."""
    stat = procfs.read_stat(pid, proc)
    if stat is None or stat.gone:
        return f"process {pid} is gone"
    owner = credentials(pid, proc)
    if owner is None or owner.uid != beacon_stat.st_uid:
        return f"process {pid} does not run as the beacon's owner (uid {beacon_stat.st_uid})"
    if procfs.start_time(stat, boot) > created_at + START_MARGIN_S:
        return f"process {pid} started after the beacon was made (a reused pid)"
    if not holds_file(pid, beacon_stat, proc):
        return f"process {pid} neither maps nor holds the beacon open"
    return ""


def refuse_environment(env: dict[str, str] | None, rank: int, world_size: int) -> str:
    """Why a verified process's environment disagrees with its beacon; "" when it agrees."""
    if env is None:
        return "its environment cannot be read"
    if "RANK" not in env:
        return ""  # a spawned rank: the beacon's writer, whose rank came from init_process_group
    if env["RANK"] != str(rank):
        return f"its RANK is {env.get('RANK')!r}, its beacon says {rank}"
    if env.get("WORLD_SIZE", str(world_size)) != str(world_size):
        return f"its WORLD_SIZE is {env.get('WORLD_SIZE')!r}, its beacon says {world_size}"
    return ""
