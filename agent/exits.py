"""How a worker's process ended, seen from outside it (agent process): the signal that killed
it, and whether the kernel's OOM killer sent it.

The agent is not a worker's parent (torchrun is, and reaps it within 0.1 s), so the exit status
is not its to wait for, and a killed process leaves nothing in its beacon. Where it can, the
agent reads:
- the kernel's process events (the proc connector, a netlink socket; it needs CAP_NET_ADMIN):
  the exit status and time of every process that ends, as it ends;
- /proc/PID/stat of a zombie its parent has not reaped yet (its exit status field);
- the kernel log (/dev/kmsg; root) for the OOM killer's "Killed process PID" and "oom-kill:
  ... pid=PID" records, and the worker's memory cgroup's oom_kill counter (cgroup v2
  memory.events, v1 memory.oom_control), which any user may read.
What none of them shows stays unknown: the incident then says the exit code is unknown.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Collection

log = logging.getLogger(__name__)

# linux/connector.h and linux/cn_proc.h
NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_RCVBUFFORCE = 33  # asm-generic/socket.h; Python's socket module does not name it
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp (ns, CLOCK_MONOTONIC)
_EXIT = struct.Struct("=IIII")  # pid, tgid, exit status (as waitpid reports it), exit signal
_EVENT_AT = _NLMSGHDR.size + _CN_MSG.size
RECEIVE_BUFFER = 4 << 20  # a scan drains it; a burst of short-lived processes must not fill it
REMEMBERED = 4096  # exits and OOM kills kept, newest first out last

_OOM_KILLED = re.compile(rb"Killed process (\d+)|oom-kill:.*\bpid=(\d+)")
_OOM_COUNTER = re.compile(rb"^oom_kill (\d+)$", re.M)


def signal_name(status: int) -> str:
    """'SIGKILL' for a wait status that says a signal ended the process, else ''."""
    if not os.WIFSIGNALED(status):
        return ""
    number = os.WTERMSIG(status)
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_code(status: int) -> int | None:
    """The code a process that exited by itself ended with; None for one a signal ended."""
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else None


class _Bounded(OrderedDict[int, tuple[int, float]]):
    def remember(self, pid: int, value: tuple[int, float]) -> None:
        self[pid] = value
        while len(self) > REMEMBERED:
            self.popitem(last=False)


class ProcessEvents:
    """The kernel's proc connector, subscribed to: each process's exit, with its wait status."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def open(cls) -> ProcessEvents | None:
        """Subscribed events, or None where this process may not subscribe (not root)."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        except (OSError, AttributeError) as e:
            log.debug("no process events: %s", e)
            return None
        try:
            with contextlib.suppress(OSError):  # a larger buffer where allowed; fine without
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
            sock.bind((0, CN_IDX_PROC))
            op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
            message = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
            sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(message), NLMSG_DONE, 0, 0, 0)
                      + message)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            log.debug("no process events: %s", e)
            return None
        return cls(sock)

    def drain(self, into: _Bounded, pids: Collection[int]) -> None:
        """Record the exits of `pids` that happened since the last drain: pid -> (wait status,
        unix time)."""
        offset = time.time() - time.monotonic()  # the events are stamped on CLOCK_MONOTONIC
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # a burst overflowed the buffer: those are lost
                    log.debug("process events overflowed; some exits were missed")
                    continue
                raise
            for pid, status, at in parse_exits(data):
                if pid in pids:
                    into.remember(pid, (status, offset + at))

    def close(self) -> None:
        self._sock.close()


def parse_exits(data: bytes) -> list[tuple[int, int, float]]:
    """(pid, wait status, monotonic seconds) of each process exit in a datagram of the proc
    connector; the exits of single threads are left out."""
    exits = []
    at = 0
    while at + _EVENT_AT + _EVENT.size + _EXIT.size <= len(data):
        length = _NLMSGHDR.unpack_from(data, at)[0]
        what, _cpu, stamp = _EVENT.unpack_from(data, at + _EVENT_AT)
        if what == PROC_EVENT_EXIT:
            pid, tgid, status, _ = _EXIT.unpack_from(data, at + _EVENT_AT + _EVENT.size)
            if pid == tgid:
                exits.append((pid, status, stamp / 1e9))
        if length < _NLMSGHDR.size:
            break
        at += (length + 3) & ~3
    return exits


class KernelLog:
    """/dev/kmsg from the moment it was opened: whom the OOM killer killed since."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, path: str = "/dev/kmsg") -> KernelLog | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            log.debug("no kernel log: %s", e)
            return None
        with contextlib.suppress(OSError):  # only the records from now on
            os.lseek(fd, 0, os.SEEK_END)
        return cls(fd)

    def drain(self, into: _Bounded, pids: Collection[int] = ()) -> None:
        """Record the pids the OOM killer killed since the last drain (any pid: the kill may be
        read before the worker's exit is noticed)."""
        while True:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                return
            except BrokenPipeError:  # records were overwritten before we read them
                continue
            except OSError as e:
                log.debug("kernel log: %s", e)
                return
            if not record:
                return
            for pid in oom_killed_pids(record):
                into.remember(pid, (signal.SIGKILL, time.time()))

    def close(self) -> None:
        os.close(self._fd)


def oom_killed_pids(record: bytes) -> list[int]:
    """The pids a kernel log record says the OOM killer killed."""
    return [int(m.group(1) or m.group(2)) for m in _OOM_KILLED.finditer(record)]


def oom_counter_path(pid: int, proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> str:
    """The file that counts OOM kills in the process's memory cgroup, or '' where none is
    readable."""
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if "memory" in controllers.split(","):
            candidate = f"{cgroup_root}/memory{path}/memory.oom_control"
        elif controllers == "":
            candidate = f"{cgroup_root}{path}/memory.events"
        else:
            continue
        if os.path.isfile(candidate):
            return candidate
    return ""


def oom_kills(path: str) -> int | None:
    """The cgroup's oom_kill counter, or None where it cannot be read."""
    try:
        with open(path, "rb") as f:
            match = _OOM_COUNTER.search(f.read(4096))
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _drained(source: ProcessEvents | KernelLog, into: _Bounded, pids: Collection[int]) -> bool:
    try:
        source.drain(into, pids)
    except OSError as e:
        log.warning("exit observer: %s; reading no more of it", e)
        source.close()
        return False
    return True


class ExitObserver:
    """Every source of exit statuses and OOM kills this agent may read, drained at each scan."""

    def __init__(self, events: ProcessEvents | None, kernel_log: KernelLog | None) -> None:
        self._events = events
        self._log = kernel_log
        self._exits = _Bounded()
        self._oom = _Bounded()

    @classmethod
    def open(cls) -> ExitObserver:
        return cls(ProcessEvents.open(), KernelLog.open())

    def drain(self, pids: Collection[int]) -> None:
        """Take in what happened since the last drain; a source that breaks is dropped."""
        if self._events is not None and not _drained(self._events, self._exits, pids):
            self._events = None
        if self._log is not None and not _drained(self._log, self._oom, pids):
            self._log = None

    def status(self, pid: int) -> tuple[int, float] | None:
        """The wait status and unix time of the process's exit, if an event showed it."""
        return self._exits.get(pid)

    def oom_killed(self, pid: int, since: float = 0.0) -> bool:
        """Whether the OOM killer's record of a kill of `pid` was read after `since`."""
        record = self._oom.get(pid)
        return record is not None and record[1] >= since

    def close(self) -> None:
        for source in (self._events, self._log):
            if source is not None:
                source.close()
