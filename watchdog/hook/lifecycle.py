"""The hook's public entry points and its process lifecycle (runs inside every training rank).

Stdlib only at import time: the `watchdog` package imports this, and so do the CLI and the
daemons. torch is patched when it gets imported (see `post_import`), never imported here.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, NoReturn, Protocol

from watchdog.beacon import EXIT_EXCEPTION, BeaconWriter, Identity, beacon_path
from watchdog.beacondir import user_dir
from watchdog.env import HOOK_PID, beacon_dir, int_env, job_id, short_hostname
from watchdog.errors import WatchdogError
from watchdog.hook.post_import import after_import
from watchdog.hook.recorder import Recorder

PUBLISH_INTERVAL = 0.2  # seconds: the agent reads beacons once a second by default
PUBLISHER_THREAD = "torch-hang-watchdog-publisher"

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]


class SysExit(Protocol):
    def __call__(self, status: str | int | None = None, /) -> NoReturn: ...


_recorder: Recorder | None = None  # this process's, once installed


def install() -> bool:
    """Start recording this rank's progress into its beacon; True when the hook is active.

    Needs RANK and WORLD_SIZE in the environment (torchrun sets them): anywhere else it records
    nothing and returns False, as it does in a process started by another hooked process (a
    spawned DataLoader worker inherits WATCHDOG_HOOK_PID naming its rank). Install before
    `from torch.distributed import ...` copies what the hook patches: `watchdog run` and
    `watchdog launch` install it before any user code runs. Idempotent; never raises.
    """
    global _recorder
    pid = os.getpid()
    if _recorder is not None and _recorder.pid == pid:
        return _recorder.enabled
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env or (env.get(HOOK_PID) or str(pid)) != str(pid):
        return False
    try:
        _recorder = _start(env, pid)
    except Exception as e:
        print(f"torch-hang-watchdog: hook not installed: {_one_line(e)}; training goes on "
              "without it", file=sys.stderr)
        return False
    return True


def _one_line(error: Exception) -> str:
    if isinstance(error, WatchdogError):
        return f"{error.args[0]} (fix: {error.hint})" if error.hint else str(error.args[0])
    return repr(error)


def _start(env: Mapping[str, str], pid: int) -> Recorder:
    rank = int(env["RANK"])
    identity = Identity(job_id(env), rank, int_env(env, "LOCAL_RANK", -1), int(env["WORLD_SIZE"]),
                        short_hostname(), pid, time.time())
    # Kept open for the life of the process: the beacon is made and removed through it.
    dir_fd, directory = user_dir(beacon_dir(env))
    try:
        writer = BeaconWriter(beacon_path(directory, identity.job_id, rank, pid), identity,
                              dir_fd)
    except BaseException:
        os.close(dir_fd)
        raise
    recorder = Recorder(writer, identity)
    recorder.publish()
    os.environ[HOOK_PID] = str(pid)
    os.register_at_fork(after_in_child=_disable_in_child)
    atexit.register(recorder.mark_shutdown)
    sys.excepthook = _marking_excepthook(recorder, sys.excepthook)
    sys.exit = _noting_exit(recorder, sys.exit)
    threading.Thread(target=_publish_forever, args=(recorder,), name=PUBLISHER_THREAD,
                     daemon=True).start()
    # Imported here: only a rank that installs the hook needs its patches (the daemons import
    # this package too).
    from watchdog.hook.torch_patches import TorchPatches

    after_import(TorchPatches(recorder).post_import_hooks(), recorder.fail)
    return recorder


def _disable_in_child() -> None:
    """A forked child (a DataLoader worker) shares the rank's beacon mapping: it must not write."""
    if _recorder is not None:
        _recorder.enabled = False


def _marking_excepthook(recorder: Recorder, previous: ExceptHook) -> ExceptHook:
    def excepthook(kind: type[BaseException], error: BaseException,
                   traceback: TracebackType | None) -> Any:
        recorder.mark_exit(EXIT_EXCEPTION, 1)
        return previous(kind, error, traceback)

    return excepthook


def _noting_exit(recorder: Recorder, original: SysExit) -> SysExit:
    """sys.exit that notes the exit code it asks for, so the beacon shows sys.exit(3) as 3.
    A call from another thread only ends that thread; `raise SystemExit(3)` goes unnoticed."""
    @functools.wraps(original)
    def exit(status: str | int | None = None, /) -> NoReturn:
        with contextlib.suppress(Exception):
            if threading.current_thread() is threading.main_thread():
                recorder.exit_code = _exit_code(status)
        original(status)

    return exit


def _exit_code(status: object) -> int:
    """The code a process leaving through SystemExit(status) ends with, as its parent sees it."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1  # Python prints any other status and exits with 1


def _publish_forever(recorder: Recorder) -> None:
    """Progress and liveness reach the beacon from here. Publishing stops when the process dies,
    or when native code holds the GIL for good: the stale stamp is what tells that rank from one
    blocked in a collective, which releases the GIL."""
    while not recorder.failed:
        recorder.publish()
        time.sleep(PUBLISH_INTERVAL)


def step() -> None:
    """Count one training step by hand, for loops that step no torch optimizer. Once it is
    called, optimizer steps stop counting. A no-op where the hook is not installed."""
    recorder = _recorder
    if recorder is not None:
        recorder.step()


@contextlib.contextmanager
def phase(name: str, timeout: float = 0.0) -> Iterator[None]:
    """Declare a named phase (checkpoint, evaluation, ...) in which this rank may make no
    progress for up to `timeout` seconds (0: the job's usual stall timeout applies).

    Phases nest: leaving one restores the enclosing phase. A no-op where the hook is not
    installed; it never raises (what the `with` body raises passes through unchanged).
    """
    recorder = _recorder
    if recorder is None:
        yield
        return
    previous = recorder.set_phase((name, time.time(), timeout))
    try:
        yield
    finally:
        recorder.set_phase(previous)
