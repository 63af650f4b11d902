"""py-spy stack dumps for the agent (asyncio, in the agent's process).

A dump attaches with ptrace, so a worker is briefly paused. The guarantee: a target that was
running before a dump is running after it (SIGCONT if py-spy died holding it), and a target
someone else stopped stays stopped and is reported as such. A stopped process cannot be dumped
blocking (py-spy: "Failed to get stack traces"), so it gets `--nonblocking` at once.

With `native`, a dump first asks for native frames too (C, C++ and CUDA-library frames between
the Python ones); that is slower and fails on more processes, so it has a shorter timeout and
falls back to Python frames alone. Symbolizing torch's libraries costs each native dump of a
rank about 0.6 s of CPU, so they take turns, one a CPU: four at once on a loaded 2-core machine
took 2.1-2.3 s each, and past the timeout all of that work is lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
from dataclasses import replace
from typing import Any

from agent import procfs
from watchdog.errors import PtraceDeniedError, PySpyMissingError
from watchdog.model import Frame, RankStack

log = logging.getLogger(__name__)

DUMP_TIMEOUT_S = 5.0
NATIVE_TIMEOUT_S = 3.0
SAMPLE_SPREAD_S = 0.8  # several stacks of one rank are taken over this long
_DENIED_MARKERS = ("Permission denied", "Operation not permitted", "ptrace")


def find_py_spy() -> str:
    """py-spy on PATH, or beside this interpreter (a venv whose bin/ is not on PATH)."""
    found = shutil.which("py-spy")
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if found:
        return found
    if os.access(beside, os.X_OK):
        return beside
    raise PySpyMissingError("py-spy was not found on PATH or beside " + sys.executable)


async def dump_stack(rank: int, pid: int, native: bool = False) -> RankStack:
    """The main thread's stack of `pid`; failures come back in RankStack.error, never raised."""
    before = procfs.read_stat(pid)
    if before is None or before.gone:
        return RankStack(rank, pid, error=f"process {pid} has exited")
    try:
        py_spy = find_py_spy()
    except PySpyMissingError as e:
        return RankStack(rank, pid, error=str(e), was_stopped=before.stopped)
    modes = [["--nonblocking"]] if before.stopped else [[], ["--nonblocking"]]
    if native and not before.stopped:
        modes.insert(0, ["--native"])
    error = ""
    for extra in modes:
        timeout = NATIVE_TIMEOUT_S if "--native" in extra else DUMP_TIMEOUT_S
        try:
            out = await _run_py_spy([py_spy, "dump", "--json", "--pid", str(pid), *extra], timeout)
            frames = main_thread_frames(json.loads(out), pid)
            return RankStack(rank, pid, frames=frames, was_stopped=before.stopped)
        except (OSError, ValueError, TimeoutError) as e:
            error = _explain_failure(str(e))
            log.warning("py-spy dump of pid %d %s failed: %s", pid, extra or "", error)
        finally:
            _resume_if_we_stopped(pid, before.stopped)
    return RankStack(rank, pid, error=error, was_stopped=before.stopped)


async def _run_py_spy(argv: list[str], timeout: float) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise TimeoutError(f"py-spy took longer than {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise OSError(err.decode("utf-8", "replace").strip() or f"exit code {proc.returncode}")
    return out.decode("utf-8", "replace")


def _explain_failure(message: str) -> str:
    if any(marker in message for marker in _DENIED_MARKERS):
        return str(PtraceDeniedError(f"py-spy could not attach: {message}"))
    return message


def _resume_if_we_stopped(pid: int, was_stopped: bool) -> None:
    after = procfs.read_stat(pid)
    if not was_stopped and after is not None and after.stopped:
        log.warning("pid %d was left stopped by py-spy; resuming it", pid)
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError as e:
            log.error("could not resume pid %d: %s", pid, e)


def main_thread_frames(dump: Any, pid: int) -> tuple[Frame, ...]:
    """Frames of the main thread in py-spy's JSON, innermost first."""
    if not isinstance(dump, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = [t for t in dump if isinstance(t, dict)]
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    main = main or next((t for t in threads if t.get("os_thread_id") == pid), None)
    if main is None:
        raise ValueError("py-spy found no main thread")
    return tuple(Frame(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line", 0)))
                 for f in main.get("frames", []) if isinstance(f, dict))


async def sample_stack(rank: int, pid: int, native_turns: asyncio.Semaphore | None = None,
                       samples: int = 1) -> RankStack:
    """`samples` stacks of `pid` spread over SAMPLE_SPREAD_S: the last one, and whether the
    innermost Python frame moved between them (a rank running Python, however slowly, is not
    hung). Only the last is taken with native frames, when given `native_turns`."""
    taken: list[RankStack] = []
    stack = RankStack(rank, pid)
    loop = asyncio.get_running_loop()
    start = loop.time()
    for index in range(samples):
        if index:  # on a schedule from the first: slow dumps do not stretch the spread
            due = start + SAMPLE_SPREAD_S * index / (samples - 1)
            await asyncio.sleep(max(0.0, due - loop.time()))
        if native_turns is not None and index == samples - 1:
            async with native_turns:  # see the module's docstring
                stack = await dump_stack(rank, pid, native=True)
        else:
            stack = await dump_stack(rank, pid)
        if stack.frames:
            taken.append(stack)
    if not taken:
        return stack
    return replace(taken[-1], samples=len(taken), moved=moved(taken))


def moved(stacks: list[RankStack]) -> bool:
    """Whether the innermost Python frame (function, file and line) differs between stacks of
    one process; native frames differ from one look to the next anyway."""
    tops = {next(((f.function, f.file, f.line) for f in s.frames if not f.native), None)
            for s in stacks}
    return len(tops) > 1


async def dump_stacks(targets: list[tuple[int, int]], native: bool = False,
                      samples: int = 1) -> list[RankStack]:
    """Stacks of (rank, pid) targets, all at once; with `native`, their native dumps one a CPU
    at a time."""
    turns = asyncio.Semaphore(len(os.sched_getaffinity(0))) if native else None
    return list(await asyncio.gather(*(sample_stack(rank, pid, turns, samples)
                                       for rank, pid in targets)))
