"""The end of one file, read with the rights of whoever runs this code: the agent itself for a
worker of its own user, or a helper process the root agent starts, which takes the worker's
credentials before it opens anything:
`python -I -S -c "$(cat agent/tailfile.py)" UID GID GROUPS PATH MAX_BYTES FOLLOW`.

Stdlib only and nothing from this package: the helper runs this source, isolated, and imports
what it needs before it gives up root (the interpreter's own files may be root's alone). A file
is read only when it opens without following a final link (unless FOLLOW: /proc/PID/fd links
are links by nature), without blocking, is a regular file, and is owned by UID.
The helper prints the offset where its bytes start, a newline, then the bytes: from one byte
before the last MAX_BYTES (to tell whether the span starts inside a line) to the end.
"""

from __future__ import annotations

import os
import stat
import sys

CHUNK = 1 << 16
NOT_OWNED = 3  # the helper's exit code for a file of another owner


class NotOwnedError(PermissionError):
    """The file belongs to someone other than the worker."""


def open_owned(path: str, owner: int | None, follow: bool) -> int | None:
    """A descriptor of `path`; None when it is missing or not a regular file (a pipe, a
    terminal, /dev/stdout: reading those would block or steal a reader's data); NotOwnedError
    when `owner` is given and does not own it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    if owner is not None and st.st_uid != owner:
        os.close(fd)
        raise NotOwnedError(f"{path} is owned by uid {st.st_uid}, not by the worker's {owner}")
    return fd


def read_end(fd: int, max_bytes: int) -> tuple[int, bytes]:
    """(start, data): the last `max_bytes` begin at `start`; `data` holds them, preceded by the
    byte before `start` when `start` is not 0. The file may shrink while it is read."""
    size = os.fstat(fd).st_size
    start = max(0, size - max_bytes)
    chunks, at = [], max(0, start - 1)
    while at < size:
        chunk = os.pread(fd, min(CHUNK, size - at), at)
        if not chunk:
            break
        chunks.append(chunk)
        at += len(chunk)
    return start, b"".join(chunks)


def become(uid: int, gid: int, groups: list[int]) -> None:
    """Take these credentials for good (root can do so, and nothing can take them back)."""
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def main(argv: list[str]) -> int:
    uid, gid = int(argv[0]), int(argv[1])
    groups = [int(g) for g in argv[2].split(",") if g]
    path, max_bytes, follow = argv[3], int(argv[4]), argv[5] == "1"
    become(uid, gid, groups)
    try:
        fd = open_owned(path, uid, follow)
    except NotOwnedError as e:
        print(e, file=sys.stderr)
        return NOT_OWNED
    if fd is None:
        return 0
    start, data = read_end(fd, max_bytes)
    sys.stdout.buffer.write(b"%d\n" % start + data)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as failed:
        print(failed, file=sys.stderr)
        sys.exit(1)
