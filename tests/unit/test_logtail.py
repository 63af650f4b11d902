"""Log tails for evidence: the end of huge sparse files, rotation, truncation, vanished files,
binary garbage, NCCL_DEBUG_FILE's %h/%p expansion, and the files a process's output goes to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.logtail import expand_nccl_debug_file, read_tail, relevant_lines

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


def test_pipes_and_directories_give_no_lines_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "nccl.fifo"
    os.mkfifo(fifo)
    assert read_tail(str(fifo)) == []
    assert read_tail(str(tmp_path)) == []


def test_binary_garbage_comes_back_printable(tmp_path: Path) -> None:
    log = tmp_path / "garbage.log"
    log.write_bytes(b"\x00" * 4096 + b"ok \x1b[31mred\x1b[0m \xff\xfe end\n"
                    + b"10%\r50%\r100% done\r\n" + b"\x00\x00\n" + b"bell\x07 tab\tx\n")
    assert read_tail(str(log)) == ["ok red \ufffd\ufffd end", "100% done", "bell? tab\tx"]


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

