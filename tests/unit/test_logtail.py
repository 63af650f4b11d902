"""Log tails for evidence: the end of huge sparse files, rotation, truncation, vanished files,
binary garbage, NCCL_DEBUG_FILE's %h/%p expansion, and the files a process's output goes to."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent._logtail import LogTailer, expand_nccl_debug_file, read_tail, relevant_lines
from agent._procfs import output_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def append(path: Path, text: str | bytes) -> None:
    with path.open("ab") as stream:
        stream.write(text.encode() if isinstance(text, str) else text)


def test_tail_of_a_ten_gigabyte_sparse_file(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    with log.open("wb") as stream:
        stream.truncate(10 * 1024**3)
    append(log, "".join(f"line {n}\n" for n in range(1000)))
    assert log.stat().st_size > 10 * 1024**3
    assert read_tail(str(log), max_lines=3) == ["line 997", "line 998", "line 999"]
    assert read_tail(str(log), max_bytes=27) == ["line 997", "line 998", "line 999"]
    assert read_tail(str(log), max_bytes=26) == ["line 998", "line 999"]


def test_partial_first_line_is_dropped_but_a_whole_one_kept(tmp_path: Path) -> None:
    log = tmp_path / "nccl.log"
    log.write_text("aaaa\nbbbb\ncccc\n")
    assert read_tail(str(log), max_bytes=7) == ["cccc"]  # starts inside "bbbb"
    assert read_tail(str(log), max_bytes=10) == ["bbbb", "cccc"]  # starts right after a newline
    append(log, "unfinished")
    assert read_tail(str(log), max_bytes=15) == ["cccc", "unfinished"]


def test_vanished_file_gives_no_lines(tmp_path: Path) -> None:
    assert read_tail(str(tmp_path / "gone.log")) == []
    tailer = LogTailer(str(tmp_path / "later.log"))
    assert tailer.read_new() == []
    (tmp_path / "later.log").write_text("first\n")
    assert tailer.read_new() == ["first"]


def test_pipes_and_directories_give_no_lines_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "nccl.fifo"
    os.mkfifo(fifo)
    assert read_tail(str(fifo)) == []
    assert LogTailer(str(fifo)).read_new() == []
    assert read_tail(str(tmp_path)) == []


def test_binary_garbage_comes_back_printable(tmp_path: Path) -> None:
    log = tmp_path / "garbage.log"
    log.write_bytes(b"\x00" * 4096 + b"ok \x1b[31mred\x1b[0m \xff\xfe end\n"
                    + b"10%\r50%\r100% done\r\n" + b"\x00\x00\n" + b"bell\x07 tab\tx\n")
    assert read_tail(str(log)) == ["ok red \ufffd\ufffd end", "100% done", "bell? tab\tx"]


def test_tailer_returns_only_new_complete_lines(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("one\ntwo\n")
    tailer = LogTailer(str(log))
    assert tailer.read_new() == ["one", "two"]
    assert tailer.read_new() == []
    append(log, "three\nfou")
    assert tailer.read_new() == ["three"]
    append(log, "r\n")
    assert tailer.read_new() == ["four"]


def test_tailer_restarts_after_rotation(tmp_path: Path) -> None:
    log = tmp_path / "rank1.log"
    log.write_text("old 1\nold 2\n")
    tailer = LogTailer(str(log))
    tailer.read_new()
    log.rename(tmp_path / "rank1.log.1")
    log.write_text("new 1\nnew 2\nnew 3\n")  # longer than the old file: size alone can't tell
    assert tailer.read_new() == ["new 1", "new 2", "new 3"]


def test_tailer_restarts_after_truncation(tmp_path: Path) -> None:
    log = tmp_path / "rank2.log"
    log.write_text("".join(f"before {n}\n" for n in range(50)))
    tailer = LogTailer(str(log))
    tailer.read_new()
    os.truncate(log, 0)  # copytruncate: same inode, smaller
    append(log, "after 1\n")
    assert tailer.read_new() == ["after 1"]


def test_tailer_reads_only_the_newest_bytes_of_a_burst(tmp_path: Path) -> None:
    log = tmp_path / "rank3.log"
    log.write_text("start\n")
    tailer = LogTailer(str(log), max_bytes=64)
    tailer.read_new()
    append(log, "".join(f"burst line {n:03d}\n" for n in range(100)))
    assert tailer.read_new() == [f"burst line {n:03d}" for n in range(96, 100)]


def test_tailer_skips_a_line_longer_than_max_bytes(tmp_path: Path) -> None:
    log = tmp_path / "rank4.log"
    log.write_text("x" * 500)
    tailer = LogTailer(str(log), max_bytes=64)
    assert tailer.read_new() == []
    append(log, "x" * 100 + "\nnext\n")
    assert tailer.read_new() == ["next"]


@pytest.mark.parametrize(("pattern", "host", "pid", "expected"), [
    ("/tmp/nccl.%h.%p.log", "node-1.cluster.local", 4242, "/tmp/nccl.node-1.4242.log"),
    ("/logs/%h/%p/%%p-%x%", "gpu7", 9, "/logs/gpu7/9/%p-%x%"),
    ("nccl-%p.txt", "pod%a/b.svc", 1, "nccl-1.txt"),
    ("%h-%h", "pod%a/b.svc", 1, "pod-a-b-pod-a-b"),
])
def test_expand_nccl_debug_file(pattern: str, host: str, pid: int, expected: str) -> None:
    assert expand_nccl_debug_file(pattern, host, pid) == expected


def test_relevant_lines_are_warns_with_bounded_context() -> None:
    info = [f"h:1:2 [0] NCCL INFO Channel {n:02d}/0 : 0[0] -> 1[1] via NET/IB/0" for n in range(8)]
    warn = "h:1:2 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer"
    lines = [*info, warn, "h:1:2 [0] NCCL INFO transport/net.cc:1298 -> 6", warn]
    assert relevant_lines(lines, context=2) == [info[6], info[7], warn, lines[9], warn]
    assert relevant_lines(lines, context=2, max_lines=2) == [info[6], info[7]]
    assert relevant_lines(info) == []


def test_relevant_lines_keep_errors_that_explain_recognises() -> None:
    """A rank's stderr as torchrun --tee writes it: its own prints, then PyTorch's errors."""
    errors = (FIXTURES / "torch_nccl_timeout.log").read_text().splitlines()
    lines = [f"step {n} loss 0.{n}" for n in range(10)] + errors
    # The watchdog timeout and the DistBackendError are findings; the lines between and before
    # them are context, the closing "ncclInternalError" line after the last one is not.
    assert relevant_lines(lines) == lines[7:13]


def test_output_files_are_read_through_the_process(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    script = "import sys, time; print('to the file', flush=True); time.sleep(30)"
    with log.open("w") as out:
        to_file = subprocess.Popen([sys.executable, "-c", script], stdout=out,
                                   stderr=subprocess.STDOUT)
    to_pipe = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    try:
        while log.stat().st_size == 0:
            assert to_file.poll() is None
            time.sleep(0.01)
        (path,) = output_files(to_file.pid)  # stdout and stderr: one file, read once
        log.rename(tmp_path / "renamed.log")  # the fd link still opens it
        assert read_tail(path) == ["to the file"]
        assert output_files(to_pipe.pid) == []
        assert output_files(2**22 + 12345) == []  # no such process
    finally:
        for proc in (to_file, to_pipe):
            proc.kill()
            proc.wait()
