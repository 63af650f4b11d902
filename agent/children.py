"""The child processes of a rank whose main thread waits on them (agent process, reading /proc).

A rank blocked in its DataLoader shows only the `for` over the loader; the fault is in the
worker it waits for. So when a rank's innermost frames wait on a child (the DataLoader's data
queue, a multiprocessing or subprocess wait), the agent takes its children's stacks too. The
agent is root: a child is only dumped when it runs as the verified rank's own user (a setuid
child, or another user's process, never is), and at most MAX_CHILDREN of them a rank.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Any

from agent import procfs, verify
from watchdog.frames import is_native_file
from watchdog.model import Frame
from watchdog.transport.limits import MAX_CHILDREN

# Where a wait blocks below the call that waits on a child: skipped to reach that call.
_WAIT_HELPERS = ("/selectors.py", "/threading.py", "/queue.py", "/socket.py")
_DATALOADER = "torch/utils/data/dataloader.py"
_DATA_WAITS = frozenset({"_try_get_data", "_get_data", "_next_data"})
_WORKER_FILE = "torch/utils/data/_utils/worker.py"
_WORKER_LOOP = "_worker_loop"


def waits_on_child(frames: Sequence[Frame]) -> bool:
    """Whether the innermost Python call, below the thread, queue and selector helpers a wait
    blocks in, waits on a child process: the DataLoader's data queue, or any wait of
    multiprocessing or subprocess. A spawned rank's outermost frames are multiprocessing's own
    too: only the innermost call counts."""
    for frame in frames:
        file = frame.file.replace("\\", "/")
        if is_native_file(frame.file) or file.endswith(_WAIT_HELPERS):
            continue
        if file.endswith(_DATALOADER):
            return _bare(frame.function) in _DATA_WAITS
        return "/multiprocessing/" in file or file.endswith("/subprocess.py")
    return False


def child_pids(pid: int, uid: int, proc: str = "/proc") -> list[int]:
    """The live children of `pid` that run as `uid` alone (every uid of theirs), oldest first,
    at most MAX_CHILDREN."""
    found = []
    for child in _children(pid, proc):
        stat = procfs.read_stat(child, proc)
        owner = verify.credentials(child, proc)
        if stat is not None and not stat.gone and stat.ppid == pid and owner is not None and (
                owner.uid == uid):
            found.append(stat)
    found.sort(key=lambda stat: (stat.start_ticks, stat.pid))
    return [stat.pid for stat in found[:MAX_CHILDREN]]


def _children(pid: int, proc: str) -> set[int]:
    """/proc/PID/task/*/children where the kernel has it (CONFIG_PROC_CHILDREN), else a scan of
    every process's parent."""
    files = glob.glob(f"{proc}/{pid}/task/*/children")
    if not files:
        return {p for p in procfs.list_pids(proc) if _parent(p, proc) == pid}
    pids: set[int] = set()
    for path in files:
        try:
            with open(path) as f:
                pids.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return pids


def _parent(pid: int, proc: str) -> int | None:
    stat = procfs.read_stat(pid, proc)
    return None if stat is None else stat.ppid


def own_frames(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """A forked child's stack goes on with the frames its parent had when it forked (a
    DataLoader worker's with the training loop's): they are cut after multiprocessing's
    `_bootstrap`, where the child began."""
    for index, frame in enumerate(frames):
        if frame.function.endswith("_bootstrap") and frame.file.replace("\\", "/").endswith(
                "/multiprocessing/process.py"):
            return tuple(frames[:index + 1])
    return tuple(frames)


def is_dataloader_worker(frames: Sequence[Frame]) -> bool:
    return any(_is_worker_loop(f.function, f.file) for f in frames)


def worker_id(raw_frames: Sequence[Any]) -> int | None:
    """The `worker_id` argument of torch's `_worker_loop` in a `py-spy dump --locals --json`
    thread's frames; None where it is not there."""
    for frame in raw_frames:
        if not isinstance(frame, dict) or not _is_worker_loop(str(frame.get("name")),
                                                              str(frame.get("filename"))):
            continue
        for local in frame.get("locals") or ():
            if isinstance(local, dict) and local.get("name") == "worker_id":
                text = str(local.get("repr", ""))
                return int(text) if text.isdigit() and len(text) < 6 else None
    return None


def _is_worker_loop(function: str, file: str) -> bool:
    return _bare(function) == _WORKER_LOOP and file.replace("\\", "/").endswith(_WORKER_FILE)


def _bare(function: str) -> str:
    """'_try_get_data' of py-spy's '_MultiProcessingDataLoaderIter._try_get_data'."""
    return function.rpartition(".")[2]


MAX_DESCENDANTS = 64  # of a child, whose CPU counts as its own (a build's compilers, say)


def tree_ticks(stat: procfs.ProcStat, proc: str = "/proc") -> int:
    """The CPU ticks of a process and of its descendants, living or reaped: a compiler driver's
    work is done by the passes it runs (gcc's cc1plus and as), and a pass counts whether it
    still runs or ended between two reads. At most MAX_DESCENDANTS descendants are read."""
    ticks, todo, seen = stat.cpu_ticks + stat.reaped_ticks, [stat.pid], 0
    while todo and seen < MAX_DESCENDANTS:
        for pid in _children(todo.pop(), proc):
            kid = procfs.read_stat(pid, proc)
            seen += 1
            if kid is not None and not kid.gone:
                ticks += kid.cpu_ticks + kid.reaped_ticks
                todo.append(pid)
    return ticks


def cpu_cores(before: int, after: int, seconds: float) -> float:
    """Cores used between two reads of `tree_ticks`, `seconds` apart."""
    used = (after - before) / os.sysconf("SC_CLK_TCK")
    return round(max(0.0, used) / max(seconds, 0.01), 3)
