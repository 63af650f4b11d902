"""Reads /proc for the agent: process state, start time, environment, CPU and I/O counters
(Linux only). Counters are read with one os.read of bytes each: at 8 ranks a report, every
microsecond counts (about 40 us a rank for all of them, tests/bench/agent_report.py)."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

# "T" (job control) only: "t" is a ptrace stop, e.g. a py-spy dump in progress.
_STOPPED_STATES = frozenset("T")
MAX_ENVIRON_BYTES = 4 << 20  # far above what execve accepts by default


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str  # one letter: R S D T t Z X I
    ppid: int
    start_ticks: int  # since boot; with the pid it names one process, even after pid reuse
    cpu_ticks: int = 0  # user + system time of the whole process so far
    reaped_ticks: int = 0  # ...and of the children it waited for (a compiler's passes, say)
    exit_status: int | None = None  # a zombie's, as waitpid reports it, where it is ours to read

    @property
    def stopped(self) -> bool:
        return self.state in _STOPPED_STATES

    @property
    def gone(self) -> bool:
        return self.state in ("Z", "X")


def read_stat(pid: int, proc: str = "/proc") -> ProcStat | None:
    """The process's stat line, or None when it no longer exists."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm may hold spaces and parentheses: the fields after it start at the last ')'.
    fields = raw[raw.rindex(")") + 2:].split()
    # The kernel shows 0 for a status that is not ours to read: only another value is one.
    status = int(fields[49]) if fields[0] in ("Z", "X") and len(fields) > 49 else 0
    return ProcStat(pid=pid, state=fields[0], ppid=int(fields[1]), start_ticks=int(fields[19]),
                    cpu_ticks=int(fields[11]) + int(fields[12]),
                    reaped_ticks=int(fields[13]) + int(fields[14]), exit_status=status or None)


def read_stat_of(pid: int, start_ticks: int, proc: str = "/proc") -> ProcStat | None:
    """`read_stat`, and None too when `pid` names another process than the one that started at
    `start_ticks` (its stat's field 22, read when the process was first seen): a pid is reused
    once its process is gone, and a signal or a dump must never reach whoever has it now."""
    stat = read_stat(pid, proc)
    return stat if stat is not None and stat.start_ticks == start_ticks else None


def _read_small(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def main_thread_sched_ns(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """The nanoseconds the process's main thread ran, and waited runnable for a CPU (schedstat:
    finer than stat's ticks, and the thread alone: not the helper threads of gloo, NCCL or the
    hook). A wait still going on is not counted yet: the kernel adds it once the thread runs."""
    raw = _read_small(f"{proc}/{pid}/task/{pid}/schedstat")
    if raw is None:
        return None
    try:
        ran, waited = raw.split()[:2]  # too few fields: ValueError too
        return int(ran), int(waited)
    except ValueError:
        return None


def io_bytes(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """Bytes the whole process read and wrote through system calls (files, pipes, sockets).
    None when /proc/PID/io is not ours to read: it needs the process's uid or CAP_SYS_PTRACE."""
    raw = _read_small(f"{proc}/{pid}/io")
    if raw is None:
        return None
    fields = dict(line.partition(b":")[::2] for line in raw.splitlines())
    try:
        return int(fields[b"rchar"]), int(fields[b"wchar"])
    except (KeyError, ValueError):
        return None


def read_environ(pid: int, proc: str = "/proc") -> dict[str, str] | None:
    """The process's initial environment, or None when it is gone or not ours to read.

    Another user's /proc/PID/environ is that user's alone (mode 0400), which root without
    CAP_DAC_READ_SEARCH cannot open; the agent then reads the same bytes from the process's
    memory, as the kernel does for that file, with CAP_SYS_PTRACE alone.
    """
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            raw: bytes | None = f.read()
    except PermissionError:
        raw = environ_from_memory(pid, proc)
    except OSError:
        return None
    if raw is None:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def environ_from_memory(pid: int, proc: str = "/proc") -> bytes | None:
    """The bytes between env_start and env_end of the process's stat line (fields 50 and 51,
    zero unless we may ptrace it), read with process_vm_readv; None when that fails."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
        fields = raw[raw.rindex(")") + 2:].split()
        start, end = int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return None
    if not 0 < start < end:
        return None
    return _read_memory(pid, start, min(end - start, MAX_ENVIRON_BYTES))


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _read_memory(pid: int, address: int, size: int) -> bytes | None:
    libc = ctypes.CDLL(None, use_errno=True)
    read = libc.process_vm_readv
    read.restype = ctypes.c_ssize_t
    buffer = ctypes.create_string_buffer(size)
    local = _IoVec(ctypes.cast(buffer, ctypes.c_void_p), size)
    remote = _IoVec(address, size)
    count = read(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return buffer.raw[:count] if count >= 0 else None


def maps_for_writing(pid: int, path: str, proc: str = "/proc") -> bool:
    """Whether the process has the file at `path` mapped shared and writable, as the writer of a
    beacon does: only a process allowed to write the file can. False when either is gone or the
    maps are not ours to read."""
    try:
        st = os.stat(path)
        with open(f"{proc}/{pid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return False
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}".encode()
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if (len(fields) >= 5 and fields[4] == str(st.st_ino).encode() and fields[3] == device
                and fields[1][1:2] == b"w" and fields[1][3:4] == b"s"):
            return True
    return False


def output_files(pid: int, proc: str = "/proc") -> list[str]:
    """Paths that open the files the process's stdout and stderr write to, each file once.

    They are its /proc fd links rather than the files' names: those open the file even from
    another container, or after it was renamed. Pipes, sockets, terminals and devices are left
    out; so is anything that is gone or not ours to read.
    """
    paths, seen = [], set()
    for fd in (1, 2):
        link = f"{proc}/{pid}/fd/{fd}"
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if target.startswith("/") and not target.startswith("/dev/") and target not in seen:
            seen.add(target)
            paths.append(link)
    return paths


def read_cmdline(pid: int, proc: str = "/proc") -> list[str]:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def list_pids(proc: str = "/proc") -> list[int]:
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def is_torchrun(cmdline: list[str]) -> bool:
    """torchrun's launcher, however it was started (console script or `-m`)."""
    return any(os.path.basename(a) == "torchrun" or a == "torch.distributed.run"
               for a in cmdline[:3])


def boot_time(proc: str = "/proc") -> float:
    with open(f"{proc}/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def start_time(stat: ProcStat, boot: float) -> float:
    """Unix time at which the process started."""
    return boot + stat.start_ticks / os.sysconf("SC_CLK_TCK")
