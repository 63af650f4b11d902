"""Files written whole or not at all, safely in a directory other users may write in (stdlib
only): the reports of `run --report`, `--report-html` and `incidents show --html`, which root
may well write into /tmp; and the job logs of `check` and `demo`, made where no one else can."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomically(path: str, text: str) -> None:
    """`text` in a new file that then replaces `path`, mode 0600 (an incident holds every
    rank's stacks and log lines, as the incident database does).

    The new file has a random name in `path`'s directory and is made with O_CREAT|O_EXCL|
    O_NOFOLLOW (mkstemp), so a link or file another user planted under a name we would use is
    never opened; the rename that puts it in place replaces a link at `path`, never follows it.
    """
    directory, name = os.path.split(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".new", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def private_file(prefix: str, name: str) -> str:
    """A new empty file `name`, mode 0600, in a new directory of a random name under the
    temporary directory (mkdtemp: 0700), made O_CREAT|O_EXCL|O_NOFOLLOW: a name another user
    could foresee (a pid) would let them plant a link there first."""
    path = os.path.join(tempfile.mkdtemp(prefix=prefix), name)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    return path
