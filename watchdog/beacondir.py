"""Where beacons live, safely, on a node shared by users who do not trust each other (stdlib
only: the hook, the agent and the CLI import it).

The base directory (default /dev/shm/torch-hang-watchdog) is made by root, mode 1777: at boot
(deploy/systemd/torch-hang-watchdog.tmpfiles.conf) or by the agent at start. A user's hook makes
it only in a directory nobody else can write, and refuses a base another user could move aside. Each
user's ranks write into a subdirectory of their own, `<base>/<uid>`, mode 0755: nobody else can
put a file or a link there. Every step goes through a descriptor opened with O_NOFOLLOW and
checked with fstat, so a base made by another user, or a link planted where ours should be,
can neither redirect a write nor make us use a directory we do not own. When `<uid>` is taken
by someone else, the hook makes `<uid>-<random>` instead (any name works: the agent trusts the
owner of a subdirectory, not its name).

Beacons are created under a temporary name with O_EXCL|O_NOFOLLOW, their space reserved
(posix_fallocate: on tmpfs, ftruncate reserves nothing, and a write into a page that a full
/dev/shm cannot back kills the writer with SIGBUS), filled, then renamed into place: the agent
never sees a beacon half made.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from watchdog.errors import BeaconError

BASE_MODE = 0o1777  # every user makes a subdirectory; the sticky bit keeps each one theirs
USER_DIR_MODE = 0o755  # only its owner writes; readers (an agent without root) may read
BEACON_MODE = 0o644
SUFFIX = ".beacon"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FALLBACK_TRIES = 16
_TMPFILES_HINT = ("have root create it: the agent does at start, and at boot "
                  "deploy/systemd/torch-hang-watchdog.tmpfiles.conf makes it mode 1777; or set "
                  "WATCHDOG_BEACON_DIR to a directory of your own")


def open_base(base: str, create: bool = True) -> int:
    """A descriptor of the base directory, made 1777 when missing by root (the agent makes it
    at start), or by its user in a directory only they can write (`watchdog run`'s own).
    BeaconError when it is a symbolic link, not a directory, or another user could move it
    aside: a base a user made in a shared place (/dev/shm) is that user's to rename, and the
    jobs of everyone else would write where no agent looks (issue 37, finding 6)."""
    if create and _may_make(base):
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o700)
            os.chmod(base, BASE_MODE)  # mkdir's mode passes through the umask
    try:
        fd = os.open(base, _DIR_FLAGS)
    except OSError as e:
        raise BeaconError(f"cannot use the beacon directory {base}: {_why(e)}",
                          hint=_TMPFILES_HINT) from e
    st = os.fstat(fd)
    mine = st.st_uid == os.geteuid() and (not st.st_mode & 0o022 or _private_parent(base))
    if st.st_uid != 0 and not mine:
        os.close(fd)
        raise BeaconError(f"the beacon directory {base} belongs to uid {st.st_uid} (mode "
                          f"{stat.S_IMODE(st.st_mode):o}), who can move it aside",
                          hint=f"have root remove it; {_TMPFILES_HINT}")
    return fd


def _may_make(base: str) -> bool:
    """Root makes the base anywhere; a user only in a directory nobody else can write."""
    return os.geteuid() == 0 or _private_parent(base)


def _private_parent(base: str) -> bool:
    """Whether the base's directory is ours and nobody else's to write: there no one can move
    the base aside, whatever its own mode."""
    try:
        st = os.stat(os.path.dirname(os.path.abspath(base)))
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def user_dir(base: str) -> tuple[int, str]:
    """This user's beacon subdirectory under `base`, made if needed: (descriptor, path).

    BeaconError, with a hint, when none can be made (a base that another user made mode 0755).
    """
    uid = os.geteuid()
    base_fd = open_base(base)
    try:
        fd = _own_subdir(base_fd, str(uid), uid)
        name = str(uid)
        for _ in range(_FALLBACK_TRIES if fd is None else 0):
            name = f"{uid}-{secrets.token_hex(4)}"
            fd = _own_subdir(base_fd, name, uid)
            if fd is not None:
                break
    except PermissionError as e:
        owner = os.fstat(base_fd).st_uid
        raise BeaconError(f"cannot make a beacon directory in {base} (owned by uid {owner}, "
                          f"mode {stat.S_IMODE(os.fstat(base_fd).st_mode):o})",
                          hint=_TMPFILES_HINT) from e
    finally:
        os.close(base_fd)
    if fd is None:
        raise BeaconError(f"every beacon directory name tried in {base} was taken",
                          hint=_TMPFILES_HINT)
    return fd, os.path.join(base, name)


def _own_subdir(base_fd: int, name: str, uid: int) -> int | None:
    """A descriptor of `name` in the base if it is a directory `uid` owns (made when missing,
    set to 0755 either way); None when the name is taken by anything else."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=base_fd)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=base_fd)
    except OSError:  # a link (ELOOP), a file (ENOTDIR), or unreadable: not ours
        return None
    if os.fstat(fd).st_uid != uid:
        os.close(fd)
        return None
    os.fchmod(fd, USER_DIR_MODE)
    return fd


def create_beacon_file(dir_fd: int, name: str, size: int) -> int:
    """A new file of `size` reserved bytes, mode 0644, under a temporary name in the directory
    `dir_fd`; `publish_beacon_file` gives it its name once it holds a whole beacon."""
    temporary = _temporary(name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary, dir_fd=dir_fd)  # left by a process that had this pid before
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 BEACON_MODE, dir_fd=dir_fd)
    try:
        os.fchmod(fd, BEACON_MODE)
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise BeaconError(f"cannot reserve {size} bytes for the beacon: {_why(e)}",
                          hint="free space in /dev/shm (df /dev/shm), or set WATCHDOG_BEACON_DIR "
                               "to a file system with room") from e
    return fd


def publish_beacon_file(dir_fd: int, name: str) -> None:
    """Give the file `create_beacon_file` made its real name (replacing a stale one)."""
    os.rename(_temporary(name), name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _temporary(name: str) -> str:
    return f".{name}.new"


def _why(error: OSError) -> str:
    return error.strerror or str(error)
