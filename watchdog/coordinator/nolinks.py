"""The store's files are opened and changed without following links (issue 37, findings 3
and 4). Root runs `watchdog incidents --db PATH` on a path another user may own, and a
coordinator may keep its database where another user can write: a link planted at the
database, its `-wal` or `-shm`, or the spill file must not make root change the mode of,
create, append to or read the file it points at. Each is opened O_PATH|O_NOFOLLOW (an O_PATH
descriptor drops no POSIX lock when closed, so SQLite's locks on a live database survive the
check) and changed through that descriptor."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat

from watchdog.errors import StoreError

log = logging.getLogger(__name__)

_HINT = ("remove the link, or pass --db a path in a directory only you can write; a database "
         "is never opened through a symbolic link")


def make_private(path: str) -> None:
    """The database created 0600 where absent; it, its WAL and shared-memory files made 0600
    where we own them and others could read them. StoreError when any is a link."""
    with contextlib.suppress(FileExistsError):  # O_EXCL: a link there, dangling or not, stays
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    for name in (path, f"{path}-wal", f"{path}-shm"):
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                raise StoreError(f"{name} is a symbolic link: refusing to open the incident "
                                 "database through it", hint=_HINT)
            # Files only: a directory given as the database (even "/") is refused by SQLite,
            # and must not lose its mode first.
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
                os.chmod(f"/proc/self/fd/{fd}", 0o600)
        finally:
            os.close(fd)


def warn_shared_directory(path: str) -> None:
    """Root keeping a database where another user can write: that user can swap its files
    between any check and SQLite's own opening of its WAL. A sticky directory of root's
    (/tmp) is spared: there nobody may rename or remove root's files, and the kernel's
    fs.protected_symlinks keeps root from following another user's link."""
    if os.geteuid() != 0:
        return
    directory = os.path.dirname(os.path.abspath(path))
    with contextlib.suppress(OSError):
        st = os.stat(directory)
        sticky = st.st_uid == 0 and st.st_mode & stat.S_ISVTX
        if st.st_uid != 0 or (st.st_mode & 0o022 and not sticky):
            log.warning("the incident database %s is in %s, which another user can write "
                        "(owner uid %d, mode %o): keep root's database in a directory only "
                        "root can write", path, directory, st.st_uid, st.st_mode & 0o7777)


def open_own(path: str, flags: int) -> int:
    """`path` opened with `flags` (0600 if created), never through a link, and only a regular
    file of ours: the spill file. OSError (ELOOP) otherwise."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise OSError(errno.ELOOP, "not a regular file of this user: refusing it", path)
    return fd
