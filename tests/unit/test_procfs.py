"""The agent's /proc reading in this process: the environment read from a process's memory is
the same as its /proc environ file, which is how another user's worker is verified without
CAP_DAC_READ_SEARCH."""

from __future__ import annotations

import os
from pathlib import Path

from agent import procfs


def test_environment_from_memory_matches_the_environ_file() -> None:
    with open(f"/proc/{os.getpid()}/environ", "rb") as f:
        assert procfs.environ_from_memory(os.getpid()) == f.read()


def test_a_process_that_is_not_there_has_no_environment(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "stat").write_text("4242 (python) S 1 " + "0 " * 60)  # env_start 0
    assert procfs.environ_from_memory(4242, str(tmp_path)) is None
    assert procfs.environ_from_memory(4243, str(tmp_path)) is None
    assert procfs.read_environ(4243, str(tmp_path)) is None
