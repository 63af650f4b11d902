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

from watchdog.beacon import CHECK_NAMES, EXIT_EXCEPTION, BeaconWriter, Identity, beacon_path
from watchdog.beacondir import user_dir
from watchdog.env import (
    ATTEMPT,
    CHECK_EVERY,
    CHECKS,
    HOOK_PID,
    beacon_dir,
    int_env,
    job_id,
    short_hostname,
)
from watchdog.errors import WatchdogError
from watchdog.hook import checks
from watchdog.hook.exit_reason import describe
from watchdog.hook.post_import import after_import
from watchdog.hook.recorder import Recorder

PUBLISH_INTERVAL = 0.2  # seconds: the agent reads beacons once a second by default
# The kept losses are read 4 times between publishes: a loss held 0.2 s (700 of the bench's
# 0.28 ms steps) cost the training thread 5 us per step in the next steps' allocations, one
# held 0.05 s 0-2 us (hook/losses.py gives the losses read back to the training thread).
READS_PER_PUBLISH = 4
PUBLISHER_THREAD = "torch-hang-watchdog-publisher"
SHUTDOWN_WAIT = 1.0  # seconds an exiting rank waits for a publish in progress
# The phase of a rank from its sys.exit or uncaught exception until it is gone: its exit
# handlers (torch's, the user's) may take seconds, in which the rank makes no progress and its
# peers wait for it, yet it is leaving, which is the launcher's to handle, not hung (one took
# 5 s on a loaded machine). The hook's own handler, the last, starts it afresh for the teardown.
EXITING = "exiting"
EXIT_GRACE_S = 10.0

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]


class SysExit(Protocol):
    def __call__(self, status: str | int | None = None, /) -> NoReturn: ...


_recorder: Recorder | None = None  # this process's, once installed: armed or recording


def install() -> bool:
    """Make this process report to the watchdog; True when it records as a rank from now on.

    With RANK and WORLD_SIZE in the environment (torchrun sets them) it records at once.
    Without them (a process `torch.multiprocessing.spawn` starts, or any other) it is *armed*:
    it records nothing until it calls init_process_group with its rank and world size (env://,
    tcp:// or file://), then records as that rank. A process started by a recording rank (a
    DataLoader worker, a subprocess: it inherits WATCHDOG_HOOK_PID naming its rank) does
    neither. Install before `from torch.distributed import ...` copies what the hook patches:
    `watchdog run` and `watchdog launch` install it before any user code runs. Idempotent;
    never raises.
    """
    global _recorder
    pid = os.getpid()
    if _recorder is not None and (_recorder.pid == pid or _recorder.writer is None):
        return _recorder.enabled  # installed here, or armed by the process it forked from
    env = os.environ
    if (env.get(HOOK_PID) or str(pid)) != str(pid):
        return False
    recorder = Recorder()
    try:
        if "RANK" in env and "WORLD_SIZE" in env:
            _start(recorder, _identity(env, int(env["RANK"]), int(env["WORLD_SIZE"]), pid))
        os.register_at_fork(after_in_child=_disable_in_child)
        # Imported here: only a rank, or a process that may become one, needs its patches (the
        # daemons import this package too).
        from watchdog.hook.patches.install import TorchPatches

        patches = TorchPatches(recorder, functools.partial(_become_rank, recorder))
        after_import(patches.post_import_hooks(), recorder.fail)
    except Exception as e:
        _not_installed(e)
        return False
    _recorder = recorder
    return recorder.enabled


def _not_installed(error: Exception) -> None:
    """Say once, on one line, why this process records nothing."""
    if isinstance(error, WatchdogError):
        why = f"{error.args[0]} (fix: {error.hint})" if error.hint else str(error.args[0])
    else:
        why = repr(error)
    print(f"torch-hang-watchdog: hook not installed: {why}; training goes on without it",
          file=sys.stderr)


def _identity(env: Mapping[str, str], rank: int, world_size: int, pid: int) -> Identity:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of a world of {world_size} (RANK must be "
                         "below WORLD_SIZE)")
    return Identity(job_id(env), rank, int_env(env, "LOCAL_RANK", -1), world_size,
                    short_hostname(), pid, time.time(), attempt=int_env(env, ATTEMPT, 0))


def _start(recorder: Recorder, identity: Identity) -> None:
    """Create the rank's beacon and record into it from now on."""
    enabled, unknown = checks.parse_checks(os.environ.get(CHECKS, ""))
    if unknown:
        print(f"torch-hang-watchdog: {CHECKS} names no check {', '.join(unknown)} (checks: "
              f"{', '.join(CHECK_NAMES)})", file=sys.stderr)
    every = max(1, int_env(os.environ, CHECK_EVERY, checks.CHECK_EVERY))
    # Kept open for the life of the process: the beacon is made and removed through it.
    dir_fd, directory = user_dir(beacon_dir(os.environ))
    try:
        writer = BeaconWriter(beacon_path(directory, identity.job_id, identity.rank,
                                          identity.pid), identity, dir_fd)
    except BaseException:
        os.close(dir_fd)
        raise
    recorder.start(writer, identity, enabled, every)
    recorder.publish()
    os.environ[HOOK_PID] = str(identity.pid)
    stop = threading.Event()
    publisher = threading.Thread(target=_publish_forever, args=(recorder, stop),
                                 name=PUBLISHER_THREAD, daemon=True)
    atexit.register(_shut_down, recorder, publisher, stop)
    sys.excepthook = _marking_excepthook(recorder, sys.excepthook)
    sys.exit = _noting_exit(recorder, sys.exit)
    publisher.start()


def _become_rank(recorder: Recorder, rank: int, world_size: int) -> None:
    """An armed process calls init_process_group as `rank` of `world_size`: record from now on.
    Where that cannot be done it says why once, and the process runs on unrecorded."""
    if recorder.writer is not None or recorder.failed:
        return
    try:
        _start(recorder, _identity(os.environ, rank, world_size, os.getpid()))
    except Exception as e:
        recorder.could_not_start()
        _not_installed(e)


def _disable_in_child() -> None:
    """A forked child (a DataLoader worker) shares the rank's beacon mapping: it must not write.
    The child of an armed process stays armed: `start_processes(..., start_method="fork")`
    forks the ranks."""
    if _recorder is not None and _recorder.writer is not None:
        _recorder.forked()


def _marking_excepthook(recorder: Recorder, previous: ExceptHook) -> ExceptHook:
    def excepthook(kind: type[BaseException], error: BaseException,
                   traceback: TracebackType | None) -> Any:
        with contextlib.suppress(Exception):
            recorder.note_exit(1)
            _leaving(recorder, recorder.exit_at)
            recorder.mark_exit(EXIT_EXCEPTION, 1, describe(error))
        return previous(kind, error, traceback)

    return excepthook


def _noting_exit(recorder: Recorder, original: SysExit) -> SysExit:
    """sys.exit that notes the exit code it asks for, so the beacon shows sys.exit(3) as 3, and
    when: the exit is timed at the call. Asked for with an exception in hand, as a launcher's
    wrapper does after catching what the rank raised (torch.multiprocessing.spawn's), a code
    other than 0 records that exception. Until the process is gone the rank is in the phase
    EXITING. A call from another thread only ends that thread; `raise SystemExit(3)` goes
    unnoticed. A SystemExit caught and survived leaves the phase on until its timeout."""
    @functools.wraps(original)
    def exit(status: str | int | None = None, /) -> NoReturn:
        with contextlib.suppress(Exception):
            if threading.current_thread() is threading.main_thread():
                code = _exit_code(status)
                recorder.note_exit(code)
                _leaving(recorder, recorder.exit_at)
                handling = sys.exc_info()[1]
                if code != 0 and handling is not None:
                    recorder.mark_exit(EXIT_EXCEPTION, code, describe(handling))
        original(status)

    return exit


def _exit_code(status: object) -> int:
    """The code a process leaving through SystemExit(status) ends with, as its parent sees it."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1  # Python prints any other status and exits with 1


def _publish_forever(recorder: Recorder, stop: threading.Event) -> None:
    """Progress and liveness reach the beacon from here. Publishing stops when the process dies,
    or when native code holds the GIL for good: the stale stamp is what tells that rank from one
    blocked in a collective, which releases the GIL. Between publishes it reads the losses
    kept so far."""
    rounds = 0
    while not recorder.failed and not stop.wait(PUBLISH_INTERVAL / READS_PER_PUBLISH):
        rounds += 1
        if rounds % READS_PER_PUBLISH:
            recorder.read_losses()
        else:
            recorder.publish()


def _shut_down(recorder: Recorder, publisher: threading.Thread, stop: threading.Event) -> None:
    """atexit: the publisher ends before the interpreter finalizes. A daemon thread found inside
    torch then (reading a loss back, with the GIL released) is ended by the interpreter in the
    middle of a C++ call that may not unwind, and the whole rank aborts ("terminate called
    without an active exception"). A publish takes milliseconds; the wait is bounded all the
    same, as the exit is the user's."""
    stop.set()
    if publisher.is_alive():
        publisher.join(SHUTDOWN_WAIT)
    # The last exit handler: the interpreter's teardown follows (seconds on a loaded node),
    # with no heartbeat. Reaching here is the exit's progress, so its grace starts afresh,
    # unless a phase declared for the exit lasts longer (destroy_process_group's).
    now = time.time()
    if recorder.phase_ends < now + EXIT_GRACE_S:
        _leaving(recorder, now)
    recorder.mark_shutdown()


def _leaving(recorder: Recorder, since: float) -> None:
    """The rank is on its way out (sys.exit, an uncaught exception, its last exit handler):
    in the phase EXITING, as its exit is the launcher's to handle, for EXIT_GRACE_S."""
    recorder.set_phase((EXITING, since, EXIT_GRACE_S))


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

    Phases nest: leaving one restores the enclosing phase, unless sys.exit was called inside
    it (the rank is EXITING). A no-op where the hook is not installed; it never raises (what
    the `with` body raises passes through unchanged).
    """
    recorder = _recorder
    if recorder is None:
        yield
        return
    began = time.time()
    previous = recorder.set_phase((name, began, timeout))
    try:
        yield
    finally:
        if recorder.exit_at < began:
            recorder.set_phase(previous)
