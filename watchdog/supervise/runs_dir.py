"""Finding the coordinators on this machine (CLI process): `watchdog run` puts its embedded
coordinator's socket in a per-user directory of runs, and `watchdog status` without
`--coordinator` asks every one it finds there, and the service coordinator at the default
address, and merges their jobs.

The runs directory is `$XDG_RUNTIME_DIR/torch-hang-watchdog` when that directory is the user's
own, else `/tmp/torch-hang-watchdog-<uid>`; 0700, checked to belong to the user before use. A
socket is `run-<pid>.sock`, 0600. A user sees their own runs, root sees every user's. Sockets
of runs that died without cleaning up (SIGKILL) are removed when found. Every directory and
socket is opened without following links and checked to belong to the directory's owner before
anything connects to it, so a user cannot point root's `watchdog status` elsewhere.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import re
import socket
import stat
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

NAME = "torch-hang-watchdog"
_SOCKET = re.compile(r"run-(\d+)\.sock")
MAX_UNIX_PATH = 107  # bytes in sockaddr_un.sun_path, less the terminating NUL
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class RunSocket:
    """One `watchdog run`'s coordinator, held open: `address` reaches exactly the socket that
    was checked, whatever happens to its path afterwards."""

    pid: int
    uid: int
    path: str
    fd: int  # O_PATH descriptor of the socket

    @property
    def address(self) -> str:
        return f"unix:/proc/self/fd/{self.fd}"

    @property
    def label(self) -> str:
        return f"watchdog run, pid {self.pid}, user {_user_name(self.uid)}"


def own_runtime_dir(env: Mapping[str, str] = os.environ) -> str | None:
    """$XDG_RUNTIME_DIR when it is this user's own private directory (0700, as the XDG spec
    has it), not a link; else None."""
    runtime = env.get("XDG_RUNTIME_DIR", "")
    try:
        st = os.lstat(runtime) if os.path.isabs(runtime) else None
    except OSError:
        return None
    if st is None or not _private_to(st, os.geteuid()) or st.st_mode & 0o077:
        return None
    return runtime


def runs_dir(env: Mapping[str, str] = os.environ) -> str:
    """Where this user's runs put their sockets."""
    runtime = own_runtime_dir(env)
    return os.path.join(runtime, NAME) if runtime else f"/tmp/{NAME}-{os.geteuid()}"


def claim_run_socket(pid: int, env: Mapping[str, str] = os.environ) -> str | None:
    """The path for run `pid`'s coordinator socket, its directory made and checked; None, with
    a warning, when the directory cannot be trusted (then the run stays out of sight)."""
    directory = runs_dir(env)
    path = os.path.join(directory, f"run-{pid}.sock")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError as e:
        log.warning("cannot make %s (%s): `watchdog status` will not find this run",
                    directory, e.strerror)
        return None
    if not _private_to(st, os.geteuid()):
        log.warning("%s is not a directory of yours that only you can write (owner uid %d, "
                    "mode %o): `watchdog status` will not find this run", directory,
                    st.st_uid, st.st_mode & 0o7777)
        return None
    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        log.warning("%s is too long for a unix socket: `watchdog status` will not find this "
                    "run", path)
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by an earlier run that had our pid and was killed
    return path


def candidate_dirs(env: Mapping[str, str] = os.environ) -> list[tuple[str, int]]:
    """(directory, the owner it must have): ours, and for root every user's."""
    uid = os.geteuid()
    found = [(runs_dir(env), uid), (f"/run/user/{uid}/{NAME}", uid), (f"/tmp/{NAME}-{uid}", uid)]
    if uid == 0:
        for path in sorted(glob.glob(f"/run/user/*/{NAME}")):
            owner = path.split("/")[3]
            if owner.isdigit():
                found.append((path, int(owner)))
        for path in sorted(glob.glob(f"/tmp/{NAME}-*")):
            owner = path.rpartition("-")[2]
            if owner.isdigit():
                found.append((path, int(owner)))
    return found


@contextlib.contextmanager
def open_runs(dirs: Sequence[tuple[str, int]] | None = None) -> Iterator[list[RunSocket]]:
    """Every live run's socket this user may see (in `dirs`, by default `candidate_dirs()`),
    held open while the block runs."""
    runs: list[RunSocket] = []
    seen: set[tuple[int, int]] = set()
    try:
        for directory, owner in candidate_dirs() if dirs is None else dirs:
            runs += _runs_in(directory, owner, seen)
        yield runs
    finally:
        for run in runs:
            os.close(run.fd)


def _runs_in(directory: str, owner: int, seen: set[tuple[int, int]]) -> list[RunSocket]:
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return []  # absent, or a link: not a runs directory
    try:
        st = os.fstat(dir_fd)
        if (st.st_dev, st.st_ino) in seen or not _private_to(st, owner):
            return []
        seen.add((st.st_dev, st.st_ino))
        runs = []
        for entry in sorted(os.listdir(dir_fd)):
            run = _open_run(dir_fd, directory, entry, owner)
            if run is not None:
                runs.append(run)
        return runs
    finally:
        os.close(dir_fd)


def _open_run(dir_fd: int, directory: str, name: str, owner: int) -> RunSocket | None:
    match = _SOCKET.fullmatch(name)
    if match is None:
        return None
    pid = int(match.group(1))
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != owner:
        os.close(fd)
        return None
    run = RunSocket(pid, owner, os.path.join(directory, name), fd)
    listener = _listener_uid(run)
    if _pid_owner(pid) != owner or listener is None:
        os.close(fd)
        _remove_stale(dir_fd, name, owner)
        return None
    if listener != owner:
        os.close(fd)
        log.warning("skipped %s: it is listened on by uid %d, not by its owner", run.path,
                    listener)
        return None
    return run


def _listener_uid(run: RunSocket) -> int | None:
    """The uid the kernel says listens on the socket (SO_PEERCRED): whose answers these are,
    whatever the file says. None when nothing listens any more (its run was killed, and the pid
    is someone else's now)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(run.address.removeprefix("unix:"))
        except (ConnectionRefusedError, FileNotFoundError):
            return None
        except OSError:
            return run.uid  # busy or slow: let the status call say what is wrong
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return int(_UCRED.unpack(creds)[1])


def _remove_stale(dir_fd: int, name: str, owner: int) -> None:
    if os.geteuid() not in (0, owner):
        return
    with contextlib.suppress(OSError):
        st = os.lstat(name, dir_fd=dir_fd)
        if stat.S_ISSOCK(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
            log.info("removed the socket of a run that is gone: %s", name)


def _pid_owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _private_to(st: os.stat_result, owner: int) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid == owner and not st.st_mode & 0o022


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
