"""Beacon files as the agent finds, opens and reads them (agent process, off its event loop).

Every user can put files in their own subdirectory of the beacon directory, so each file is
hostile until checked: it is found only in a subdirectory that no one but its owner can write,
opened relative to that directory's descriptor, never through a link (O_NOFOLLOW) and never
blocking (O_NONBLOCK: a FIFO named x.beacon), and kept only when fstat says it is a regular file
of exactly one beacon's size owned by the directory's owner. It is read with pread into bytes,
never mapped: a file its owner truncates then reads short, where a mapping would kill the agent
with SIGBUS.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from dataclasses import dataclass

from watchdog.beacon import BeaconSnapshot, layout, read_beacon
from watchdog.beacondir import SUFFIX
from watchdog.errors import BeaconError

log = logging.getLogger(__name__)

MAX_ENTRIES_PER_DIR = 4096  # a user's directory of junk files costs a bounded scan
READ_ATTEMPTS = 100
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_SEQ = slice(layout.OFF_SEQ, layout.OFF_SEQ + 8)


@dataclass(frozen=True)
class Found:
    """One `*.beacon` entry of a user's subdirectory, as listed (not yet opened)."""

    directory: str
    name: str
    owner: int  # the subdirectory's owner: the only user who could have put the file there
    signature: tuple[int, int, int]  # inode, size, mtime: a file that changes is looked at again

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)


def scan(base: str) -> list[Found]:
    """The beacon entries in every subdirectory of `base` that only its owner can write."""
    try:
        base_fd = os.open(base, _DIR_FLAGS)
    except FileNotFoundError:
        return []
    try:
        found: list[Found] = []
        with os.scandir(base_fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    found += _scan_subdir(base_fd, os.path.join(base, entry.name), entry.name)
        return found
    finally:
        os.close(base_fd)


def _scan_subdir(base_fd: int, directory: str, name: str) -> list[Found]:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=base_fd)
    except OSError:
        return []  # replaced by a link or a file since it was listed, or not ours to read
    try:
        st = os.fstat(fd)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return []  # others could have planted anything in it
        found = []
        with os.scandir(fd) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES_PER_DIR:
                    log.warning("%s holds over %d entries; looking at the first only",
                                directory, MAX_ENTRIES_PER_DIR)
                    break
                if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                    with contextlib.suppress(OSError):
                        s = entry.stat(follow_symlinks=False)
                        found.append(Found(directory, entry.name, st.st_uid,
                                           (s.st_ino, s.st_size, s.st_mtime_ns)))
        return found
    finally:
        os.close(fd)


def _open_dir(found: Found) -> int:
    """The subdirectory again, still a directory of the same owner (it was listed by path)."""
    fd = os.open(found.directory, _DIR_FLAGS)
    if os.fstat(fd).st_uid != found.owner:
        os.close(fd)
        raise BeaconError(f"{found.directory} changed owner")
    return fd


def open_beacon(found: Found) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the beacon and its fstat; BeaconError unless it is a regular
    file of exactly one beacon's size, owned by its directory's owner."""
    try:
        dir_fd = _open_dir(found)
        try:
            fd = os.open(found.name, _FILE_FLAGS, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise BeaconError(f"cannot open {found.path}: {e.strerror or e}") from e
    st = os.fstat(fd)
    problem = ("not a regular file" if not stat.S_ISREG(st.st_mode)
               else f"owned by uid {st.st_uid}, not by its directory's owner {found.owner}"
               if st.st_uid != found.owner
               else f"{st.st_size} bytes, not {layout.SIZE}" if st.st_size != layout.SIZE
               else "")
    if problem:
        os.close(fd)
        raise BeaconError(f"{found.path} is {problem}")
    return fd, st


def read(fd: int) -> BeaconSnapshot:
    """A consistent snapshot of the beacon open at `fd`, or BeaconError."""
    return read_beacon(copy(fd), attempts=1)


def copy(fd: int) -> bytes:
    """The bytes of the beacon open at `fd`, copied whole under its seqlock (the counter read
    before and after the copy is the same even value), not yet decoded; or BeaconError."""
    size = os.fstat(fd).st_size
    if size != layout.SIZE:
        raise BeaconError(f"beacon is now {size} bytes, not {layout.SIZE}")
    for _ in range(READ_ATTEMPTS):
        before = os.pread(fd, 8, layout.OFF_SEQ)
        data = os.pread(fd, layout.SIZE, 0)
        if len(before) == 8 and not before[0] & 1 and data[_SEQ] == before == os.pread(
                fd, 8, layout.OFF_SEQ):
            return data
        if len(data) < layout.SIZE:
            raise BeaconError(f"beacon shrank to {len(data)} bytes while read")
        time.sleep(0)  # the writer is mid-record: let it run
    raise BeaconError(f"beacon kept changing during {READ_ATTEMPTS} reads")


def remove(found: Found) -> bool:
    """Delete a stale beacon, through its directory's descriptor: never a file elsewhere. False
    when it cannot be (a root agent without CAP_DAC_OVERRIDE, in a user's own directory)."""
    try:
        dir_fd = _open_dir(found)
    except (OSError, BeaconError) as e:
        log.debug("could not remove %s: %s", found.path, e)
        return False
    try:
        os.unlink(found.name, dir_fd=dir_fd)
        return True
    except OSError as e:
        log.debug("could not remove %s: %s", found.path, e)
        return False
    finally:
        os.close(dir_fd)
