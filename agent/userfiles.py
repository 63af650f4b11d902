"""A worker's log files, read with the worker's own rights (agent process).

NCCL_DEBUG_FILE is a path the worker chose, and its stdout may be any file it was handed: a
root agent that opened them itself would read, for any user, files that user cannot read
(a link to /etc/shadow, a root-only log), and hand their lines to `watchdog status`. So an agent
running as another user than the worker reads through a helper process, the code of
`agent/tailfile.py` in a fresh interpreter with an empty environment, which takes the worker's
uid, gid and groups before it opens anything. (The helper drops its privileges itself: a
process that uses gRPC must not fork to do so, since gRPC's fork handlers crash the child.) The
file must open without a final link (NCCL_DEBUG_FILE) and be a regular file owned by the
worker's uid. The helper's output is read up to a bound.

Paths are resolved where the worker resolved them: a relative NCCL_DEBUG_FILE in its working
directory, an absolute one under its root (/proc/PID/cwd, /proc/PID/root: containers too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path

from agent import procfs, tailfile
from agent.logtail import read_tail, relevant_lines, tail_lines
from agent.verify import Credentials
from agent.worker import Worker
from watchdog.text import printable

log = logging.getLogger(__name__)

MAX_BYTES = 256 * 1024
_HELPER = Path(tailfile.__file__).read_text()
HELPER_TIMEOUT_S = 5.0
_HEADER_BYTES = 24  # the offset line


class ReadRefusedError(OSError):
    """The file could not be read with the worker's rights."""


def in_worker_view(pid: int, path: str) -> str:
    """`path` as the worker `pid` resolves it."""
    if path.startswith("/"):
        return f"/proc/{pid}/root{path}"
    return f"/proc/{pid}/cwd/{path}"


async def tail_as(owner: Credentials, path: str, follow: bool) -> list[str]:
    """The last lines of `path`, opened with the rights of `owner` (see the module's doc); []
    when it is missing or not a regular file, ReadRefusedError when it cannot be read."""
    me = os.geteuid()
    if me == owner.uid:
        try:
            return await asyncio.to_thread(read_tail, path, MAX_BYTES, owner=owner.uid,
                                           follow=follow)
        except OSError as e:
            raise ReadRefusedError(str(e)) from e
    if me != 0:
        raise ReadRefusedError(f"the agent runs as uid {me} and cannot read as uid {owner.uid}")
    return await _tail_by_helper(owner, path, follow)


async def _tail_by_helper(owner: Credentials, path: str, follow: bool) -> list[str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", _HELPER, str(owner.uid), str(owner.gid),
            ",".join(map(str, owner.groups)), path, str(MAX_BYTES), "1" if follow else "0",
            env={}, cwd="/", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise ReadRefusedError(f"cannot start a reader as uid {owner.uid}: {e}") from e
    try:
        out, err = await asyncio.wait_for(asyncio.gather(
            _read_at_most(proc.stdout, MAX_BYTES + 1 + _HEADER_BYTES),
            _read_at_most(proc.stderr, 4096)), HELPER_TIMEOUT_S)
        code = await asyncio.wait_for(proc.wait(), HELPER_TIMEOUT_S)
    except TimeoutError:
        raise ReadRefusedError(f"reading {path} took over {HELPER_TIMEOUT_S:.0f}s") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if code != 0:
        reason = err.decode("utf-8", "replace").strip() or f"exit code {code}"
        raise ReadRefusedError(reason)
    if not out:
        return []
    header, _, data = out.partition(b"\n")
    try:
        return tail_lines(int(header), data)
    except ValueError as e:
        raise ReadRefusedError(f"the reader's output is malformed: {e}") from e


async def _read_at_most(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while stream is not None and size < limit:
        chunk = await stream.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def worker_logs(worker: Worker) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The relevant tails of the worker's NCCL debug file, and of the files its stdout and
    stderr go to (torchrun --tee or --redirects, a shell redirect), read with its rights."""
    if worker.owner is None:
        return (), ()
    pid = worker.identity.pid
    nccl = (await _relevant(worker, in_worker_view(pid, worker.nccl_debug_file), follow=False)
            if worker.nccl_debug_file else [])
    output: list[str] = []
    for path in procfs.output_files(pid):
        output += await _relevant(worker, path, follow=True)
    return tuple(nccl), tuple(output)


async def _relevant(worker: Worker, path: str, follow: bool) -> list[str]:
    assert worker.owner is not None
    try:
        return relevant_lines(await tail_as(worker.owner, path, follow))
    except ReadRefusedError as e:
        log.warning("not reading %s for rank %d of %s: %s", printable(path),
                    worker.identity.rank, printable(worker.identity.job_id), printable(str(e)))
        return []
