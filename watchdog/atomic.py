"""Files written whole or not at all, safely in a directory other users may write in (stdlib
only): the reports of `run --report`, `--report-html` and `incidents show --html`, which root
may well write into /tmp."""

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
