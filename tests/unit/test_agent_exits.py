"""How the agent learns that a worker was killed, and by whom: the kernel's process events, a
zombie's status, the OOM killer's records and the memory cgroup's counter (real formats: the
proc connector's ABI, kernel log records read on this project's build machine)."""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path

import pytest

from agent import exits
from agent.procfs import read_stat

KMSG = Path(__file__).parents[1] / "fixtures" / "kmsg" / "memcg_oom_kill.txt"


def exit_event(pid: int, tgid: int, status: int, stamp_ns: int) -> bytes:
    """One PROC_EVENT_EXIT message as the proc connector sends it (linux/cn_proc.h)."""
    event = struct.pack("=IIQ", exits.PROC_EVENT_EXIT, 1, stamp_ns)
    event += struct.pack("=IIIIII", pid, tgid, status, signal.SIGCHLD, 1, 1)
    cn = struct.pack("=IIIIHH", exits.CN_IDX_PROC, exits.CN_VAL_PROC, 7, 0, len(event), 0)
    return struct.pack("=IHHII", 16 + len(cn) + len(event), 3, 0, 0, 0) + cn + event


def test_proc_connector_exits_of_processes_not_threads() -> None:
    datagram = (exit_event(4242, 4242, signal.SIGKILL, 5_000_000_000)
                + exit_event(4250, 4242, 0, 5_100_000_000)  # a thread of 4242
                + exit_event(4243, 4243, 3 << 8, 6_000_000_000))
    assert exits.parse_exits(datagram) == [(4242, signal.SIGKILL, 5.0), (4243, 3 << 8, 6.0)]
    assert exits.parse_exits(b"\0" * 20) == []


@pytest.mark.parametrize(("status", "name", "code"), [
    (signal.SIGKILL, "SIGKILL", None), (signal.SIGSEGV | 0x80, "SIGSEGV", None),  # core dumped
    (3 << 8, "", 3), (0, "", 0), (100, "signal 100", None)])
def test_wait_statuses(status: int, name: str, code: int | None) -> None:
    assert (exits.signal_name(status), exits.exit_code(status)) == (name, code)


def test_the_oom_killers_records_name_the_pid_once_each_way() -> None:
    records = KMSG.read_bytes().splitlines()
    assert [exits.oom_killed_pids(r) for r in records] == [[], [], [5975], [5975]]


def test_the_kernel_log_is_read_from_where_it_was_opened(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1,1,-;an old record: Killed process 1 (init)\n")
    kernel = exits.KernelLog.open(str(log))
    assert kernel is not None
    with log.open("ab") as f:
        f.write(KMSG.read_bytes())
    observer = exits.ExitObserver(None, kernel)
    observer.drain({5975})
    assert observer.oom_killed(5975) and not observer.oom_killed(1)
    observer.close()


@pytest.mark.parametrize(("cgroup", "counter", "text"), [
    ("0::/user.slice/job\n", "user.slice/job/memory.events",
     b"low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n"),
    ("9:name=systemd:/\n4:memory:/process_api/ccf4\n1:cpu:/\n", "memory/process_api/ccf4/"
     "memory.oom_control", b"oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
])
def test_a_memory_cgroups_oom_kill_counter_v2_and_v1(tmp_path: Path, cgroup: str, counter: str,
                                                     text: bytes) -> None:
    (tmp_path / "proc" / "77").mkdir(parents=True)
    (tmp_path / "proc" / "77" / "cgroup").write_text(cgroup)
    path = tmp_path / "cgroup" / counter
    path.parent.mkdir(parents=True)
    path.write_bytes(text)
    found = exits.oom_counter_path(77, str(tmp_path / "proc"), str(tmp_path / "cgroup"))
    assert found == str(path)
    assert exits.oom_kills(found) == 2
    assert exits.oom_counter_path(78, str(tmp_path / "proc"), str(tmp_path / "cgroup")) == ""


def test_a_zombies_exit_status_is_read_from_its_stat(tmp_path: Path) -> None:
    """/proc/PID/stat of a zombie: field 52 is its exit status (0 where it is not ours)."""
    fields = ["Z", "1"] + ["0"] * 17 + ["123"] + ["0"] * 29 + [str(signal.SIGKILL)]
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "stat").write_text(f"9 (py thon) {' '.join(fields)}\n")
    stat = read_stat(9, str(tmp_path))
    assert stat is not None and (stat.state, stat.exit_status) == ("Z", signal.SIGKILL)
    live = read_stat(os.getpid())
    assert live is not None and live.exit_status is None
