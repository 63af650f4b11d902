"""py-spy stack dumps for the agent (asyncio, in the agent's process).

A dump attaches with ptrace, so a worker is briefly paused. The guarantee: a target that was
running before a dump is running after it (SIGCONT if py-spy died holding it), and a target
someone else stopped stays stopped and is reported as such. A stopped process cannot be dumped
blocking (py-spy: "Failed to get stack traces"), so it gets `--nonblocking` at once.

With `native`, a dump first asks for native frames too (C, C++ and CUDA-library frames between
the Python ones); that is slower and fails on more processes, so past its timeout it falls back
to Python frames alone. Symbolizing torch's libraries costs each native dump of a rank about
0.6 s of CPU, so they take turns, one a CPU: four at once on a loaded 2-core machine took
2.1-2.3 s each, and one beside a container image's build took over 3 s. Past the timeout all
of that work is lost, so each native dump may take what is left of one budget for the whole
request (NATIVE_BUDGET_S), which leaves the Python fallback time within the coordinator's wait.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import shutil
import signal
import sys
import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from agent import children, procfs, verify
from watchdog.errors import PtraceDeniedError, PySpyMissingError
from watchdog.model import DATALOADER_WORKER, ChildStack, Frame, RankStack, bounded_frames
from watchdog.text import bounded
from watchdog.transport.limits import MAX_CHILD_FRAMES, MAX_FRAMES

log = logging.getLogger(__name__)

DUMP_TIMEOUT_S = 5.0
# Native dumps of one request end this long after it began at the latest: the coordinator waits
# 10 s for a node's stacks (STACK_WAIT_S), and a Python dump takes 15-25 ms.
NATIVE_BUDGET_S = 7.0
MIN_NATIVE_S = 1.0  # less left than this: Python frames alone, at once
SAMPLE_SPREAD_S = 0.8  # several stacks of one rank are taken over this long
MAX_ERROR_BYTES = 512  # of a child's dump failure (the wire takes 4096 at most)
# py-spy's JSON of one process: 512 frames of 4 KiB names fit, with the threads beside them
# (a long name of controls, which JSON gives six bytes a character, does not: an error).
MAX_DUMP_BYTES = 4 * 1024 * 1024
MAX_STDERR_BYTES = 64 * 1024  # what is read of why it failed
DUMPS_AT_ONCE = 4  # on the node: a dump takes 15-25 ms, so a node's ranks still wait little
# ...of which one user's ranks and children hold at most this many: another user's always finds
# a turn, however many (verified) jobs the first one keeps asking about
USER_DUMPS_AT_ONCE = DUMPS_AT_ONCE - 1
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


async def dump_stack(rank: int, pid: int, start_ticks: int,
                     native_timeout: float = 0.0) -> RankStack:
    """The main thread's stack of `pid`, the process that started at `start_ticks`, with native
    frames when they come within `native_timeout` seconds (0: not asked for); failures come
    back in RankStack.error, never raised."""
    before = procfs.read_stat_of(pid, start_ticks)
    if before is None or before.gone:
        return RankStack(rank, pid, error=_gone(pid))
    thread, error = await _dump_main_thread(pid, start_ticks, before.stopped,
                                             native_timeout)
    if thread is None:
        return RankStack(rank, pid, error=bounded(error), was_stopped=before.stopped)
    # A recursion thousands deep, or a function named with a megabyte, is cut here, visibly.
    return RankStack(rank, pid, frames=bounded_frames(_frames(thread), MAX_FRAMES),
                     was_stopped=before.stopped)


async def _dump_main_thread(
        pid: int, start_ticks: int, stopped: bool, native_timeout: float = 0.0,
        with_locals: bool = False) -> tuple[dict[str, Any] | None, str]:
    """py-spy's JSON of the main thread of `pid` (while it is the process that started at
    `start_ticks`), or None and why not. `stopped`: someone else had stopped it, so it is dumped
    without blocking. Native frames first, given `native_timeout` (seconds) for them."""
    try:
        py_spy = find_py_spy()
    except PySpyMissingError as e:
        return None, str(e)
    modes = [["--nonblocking"]] if stopped else [[], ["--nonblocking"]]
    if native_timeout >= MIN_NATIVE_S and not stopped:
        modes.insert(0, ["--native"])
    error = ""
    for extra in modes:
        now = procfs.read_stat_of(pid, start_ticks)  # a failed try may have taken seconds
        if now is None or now.gone:
            return None, _gone(pid)
        timeout = native_timeout if "--native" in extra else DUMP_TIMEOUT_S
        argv = [py_spy, "dump", "--json", "--pid", str(pid), *extra]
        try:
            out = await _run_py_spy([*argv, "--locals"] if with_locals else argv, timeout)
            return main_thread(json.loads(out), pid), ""
        except (OSError, ValueError, TimeoutError) as e:
            error = _explain_failure(str(e))
            log.warning("py-spy dump of pid %d %s failed: %s", pid, extra or "", error)
        finally:
            _resume_if_we_stopped(pid, start_ticks, stopped)
    return None, error


def _gone(pid: int) -> str:
    """Why `pid` is not dumped: its process exited (and the pid may name another by now)."""
    log.info("not dumping pid %d: the process it named has exited", pid)
    return f"process {pid} has exited"


async def _run_py_spy(argv: list[str], timeout: float) -> str:
    async with _user_turns(_DUMPING_FOR.get()), _turns():
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stderr is not None
            out, err = await asyncio.wait_for(asyncio.gather(
                _read_at_most(proc.stdout, MAX_DUMP_BYTES),
                _read_at_most(proc.stderr, MAX_STDERR_BYTES)), timeout)
            if len(out) > MAX_DUMP_BYTES:
                raise ValueError(f"py-spy's output was over {MAX_DUMP_BYTES} bytes")
            await proc.wait()
        except TimeoutError:
            raise TimeoutError(f"py-spy took longer than {timeout:.0f}s") from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    if proc.returncode != 0:
        raise OSError(err.decode("utf-8", "replace").strip() or f"exit code {proc.returncode}")
    return out.decode("utf-8", "replace")


async def _read_at_most(stream: asyncio.StreamReader, limit: int) -> bytes:
    """What `stream` gives until its end, or one byte past `limit` (then the rest is left)."""
    data = bytearray()
    while len(data) <= limit:
        chunk = await stream.read(limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary())


def _turns() -> asyncio.Semaphore:
    """The node's dumps at once (every job's ranks and children): each holds up to
    MAX_DUMP_BYTES of output, parsed."""
    return _TURNS.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(DUMPS_AT_ONCE))


# The user whose process the task dumps (None: not known). A context variable, since each
# rank's and child's sampling runs as a task of its own, and the dump is several calls down.
_DUMPING_FOR: contextvars.ContextVar[int | None] = contextvars.ContextVar("dumping_for",
                                                                          default=None)
_USER_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                       dict[int | None, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary())


def _user_turns(uid: int | None) -> asyncio.Semaphore:
    """One user's dumps at once (USER_DUMPS_AT_ONCE), taken before a turn of the node's."""
    users = _USER_TURNS.setdefault(asyncio.get_running_loop(), {})
    return users.setdefault(uid, asyncio.Semaphore(USER_DUMPS_AT_ONCE))


def _explain_failure(message: str) -> str:
    if any(marker in message for marker in _DENIED_MARKERS):
        return str(PtraceDeniedError(f"py-spy could not attach: {message}"))
    return message


def _resume_if_we_stopped(pid: int, start_ticks: int, was_stopped: bool) -> None:
    after = procfs.read_stat_of(pid, start_ticks)
    if not was_stopped and after is not None and after.stopped:
        log.warning("pid %d was left stopped by py-spy; resuming it", pid)
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError as e:
            log.error("could not resume pid %d: %s", pid, e)


def main_thread_frames(dump: Any, pid: int) -> tuple[Frame, ...]:
    """Frames of the main thread in py-spy's JSON, innermost first."""
    return _frames(main_thread(dump, pid))


def main_thread(dump: Any, pid: int) -> dict[str, Any]:
    """The main thread's object in py-spy's JSON; ValueError where there is none."""
    if not isinstance(dump, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = [t for t in dump if isinstance(t, dict)]
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    main = main or next((t for t in threads if t.get("os_thread_id") == pid), None)
    if main is None:
        raise ValueError("py-spy found no main thread")
    return main


def _frames(thread: dict[str, Any]) -> tuple[Frame, ...]:
    return tuple(Frame(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line", 0)))
                 for f in _raw_frames(thread))


def _raw_frames(thread: dict[str, Any]) -> list[dict[str, Any]]:
    frames = thread.get("frames")
    return [f for f in frames if isinstance(f, dict)] if isinstance(frames, list) else []


class NativeTurns:
    """The native dumps of one request: one a CPU at a time, all before `until` (loop time)."""

    def __init__(self, until: float) -> None:
        self.turns = asyncio.Semaphore(len(os.sched_getaffinity(0)))
        self.until = until


async def sample_stack(rank: int, pid: int, start_ticks: int,
                       native_turns: NativeTurns | None = None, samples: int = 1,
                       uid: int | None = None) -> RankStack:
    """`samples` stacks of `pid` (the process that started at `start_ticks`) spread over
    SAMPLE_SPREAD_S: the last one, and whether the
    innermost Python frame moved between them (a rank running Python, however slowly, is not
    hung). Only the last is taken with native frames, when given `native_turns`. Given the
    rank's `uid`, the stacks of the children it waits on (agent.children) come too, sampled
    alongside the rank's own from the first stack that shows the wait."""
    _DUMPING_FOR.set(uid)  # this task's, and its children's tasks'
    taken: list[RankStack] = []
    stack = RankStack(rank, pid)
    kids: asyncio.Task[tuple[ChildStack, ...]] | None = None
    loop = asyncio.get_running_loop()
    start = loop.time()
    for index in range(samples):
        if index:  # on a schedule from the first: slow dumps do not stretch the spread
            await asyncio.sleep(max(0.0, _due(start, index, samples) - loop.time()))
        if native_turns is not None and index == samples - 1:
            async with native_turns.turns:  # see the module's docstring
                stack = await dump_stack(rank, pid, start_ticks,
                                         native_turns.until - loop.time())
        else:
            stack = await dump_stack(rank, pid, start_ticks)
        if stack.frames:
            taken.append(stack)
            if kids is None and uid is not None and children.waits_on_child(stack.frames):
                kids = asyncio.create_task(sample_children(pid, uid, samples - index))
    if not taken:
        return stack
    return replace(taken[-1], samples=len(taken), moved=moved([s.frames for s in taken]),
                   children=await kids if kids is not None else ())


def _due(start: float, index: int, samples: int) -> float:
    return start + SAMPLE_SPREAD_S * index / (samples - 1)


def moved(stacks: Sequence[Sequence[Frame]]) -> bool:
    """Whether the innermost Python frame (function, file and line) differs between stacks of
    one process; native frames differ from one look to the next anyway."""
    tops = {next(((f.function, f.file, f.line) for f in s if not f.native), None)
            for s in stacks}
    return len(tops) > 1


async def sample_children(pid: int, uid: int, samples: int) -> tuple[ChildStack, ...]:
    """The stacks of the children of `pid` that run as `uid` (agent.children), each sampled
    `samples` times as a rank is; a child gone in the meantime is left out."""
    pids = await asyncio.to_thread(children.child_pids, pid, uid)
    sampled = await asyncio.gather(*(sample_child(child, samples, uid) for child in pids))
    return tuple(child for child in sampled if child is not None)


def _runs_as(pid: int, uid: int | None) -> bool:
    owner = verify.credentials(pid) if uid is not None else None
    return uid is None or (owner is not None and owner.uid == uid)


async def sample_child(pid: int, samples: int, uid: int | None = None) -> ChildStack | None:
    """One child's last stack, whether its innermost frame moved, the CPU it used meanwhile
    and, for a DataLoader worker, its worker_id (from the last dump's locals); None once it
    is gone, is no longer the process it was (a reused pid), or no longer runs as `uid`
    alone: its uids are read again before each dump, since the child may exec a setuid
    program, same pid, same start time, between its listing and a dump a second later."""
    _DUMPING_FOR.set(uid)
    loop = asyncio.get_running_loop()
    start, first = loop.time(), procfs.read_stat(pid)
    if first is None or first.gone:
        return None
    ticks = await asyncio.to_thread(children.tree_ticks, first)
    stacks: list[tuple[Frame, ...]] = []
    thread, error, state = None, "", first.state
    for index in range(samples):
        if index:
            await asyncio.sleep(max(0.0, _due(start, index, samples) - loop.time()))
        stat = procfs.read_stat_of(pid, first.start_ticks)
        if stat is None or stat.gone or not _runs_as(pid, uid):
            return None
        state = stat.state
        dumped, error = await _dump_main_thread(pid, first.start_ticks, stat.stopped,
                                                with_locals=index == samples - 1)
        if dumped is not None:
            thread = dumped
            stacks.append(bounded_frames(children.own_frames(_frames(dumped)),
                                         MAX_CHILD_FRAMES))
    last = procfs.read_stat_of(pid, first.start_ticks)
    if last is None or last.gone:
        return None
    used = children.cpu_cores(ticks, await asyncio.to_thread(children.tree_ticks, last),
                              loop.time() - start)
    frames = stacks[-1] if stacks else ()
    worker = children.is_dataloader_worker(frames)
    return ChildStack(
        pid, role=DATALOADER_WORKER if worker else "",
        worker_id=children.worker_id(_raw_frames(thread)) if worker and thread else None,
        state=state, frames=frames, error="" if stacks else bounded(error, MAX_ERROR_BYTES),
        moved=moved(stacks), cpu=used)


async def dump_stacks(targets: list[tuple[int, int, int, int | None]], native: bool = False,
                      samples: int = 1) -> list[RankStack]:
    """Stacks of (rank, pid, start ticks, uid) targets, all at once; with `native`, their native
    dumps one a CPU at a time. Given its uid, a rank's children come along where it waits on
    them."""
    turns = NativeTurns(asyncio.get_running_loop().time() + NATIVE_BUDGET_S) if native else None
    return list(await asyncio.gather(*(sample_stack(rank, pid, ticks, turns, samples, uid)
                                       for rank, pid, ticks, uid in targets)))
