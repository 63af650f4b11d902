"""Where `watchdog run` puts its socket and how `watchdog status` finds it: real directories and
real unix sockets in this process (no other process is started)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from watchdog.cli.status import Answer, Source, merge, render_answers
from watchdog.supervise.runs_dir import NAME, claim_run_socket, open_runs, runs_dir


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    directory = tmp_path / NAME
    directory.mkdir(mode=0o700)
    return directory


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


def bound(path: Path, sockets: list[socket.socket], listen: bool = True) -> Path:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    if listen:
        s.listen()
        sockets.append(s)
    else:
        s.close()  # the file stays: a run that was killed
    return path


def dead_pid() -> int:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


def test_a_run_claims_a_socket_in_its_users_runtime_dir(tmp_path: Path) -> None:
    path = claim_run_socket(4242, {"XDG_RUNTIME_DIR": str(tmp_path)})
    assert path == str(tmp_path / NAME / "run-4242.sock")
    assert (tmp_path / NAME).stat().st_mode & 0o777 == 0o700


def test_without_a_runtime_dir_of_our_own_runs_go_to_tmp(tmp_path: Path) -> None:
    fallback = f"/tmp/{NAME}-{os.geteuid()}"
    assert runs_dir({}) == fallback
    assert runs_dir({"XDG_RUNTIME_DIR": "relative/dir"}) == fallback
    someone_elses = tmp_path / "other"
    someone_elses.mkdir()
    if os.geteuid() == 0:
        os.chown(someone_elses, 65534, 65534)
    else:
        someone_elses = Path("/")
    assert runs_dir({"XDG_RUNTIME_DIR": str(someone_elses)}) == fallback


def test_a_runs_dir_others_can_write_is_not_used(runs: Path, caplog: pytest.LogCaptureFixture
                                                 ) -> None:
    runs.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        assert claim_run_socket(4242, {"XDG_RUNTIME_DIR": str(runs.parent)}) is None
    assert "will not find this run" in caplog.text


def test_live_runs_are_found_and_dead_ones_removed(runs: Path,
                                                   sockets: list[socket.socket]) -> None:
    live = bound(runs / f"run-{os.getpid()}.sock", sockets)
    dead = bound(runs / f"run-{dead_pid()}.sock", sockets, listen=False)
    # A live pid (our parent's) whose run was killed: nobody listens on its socket any more.
    reused = bound(runs / f"run-{os.getppid()}.sock", sockets, listen=False)
    link = runs / "run-99.sock"
    link.symlink_to(live)
    (runs / "notes.txt").write_text("not a run")
    with open_runs([(str(runs), os.geteuid())]) as found:
        assert [(r.pid, r.path) for r in found] == [(os.getpid(), str(live))]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(found[0].address.removeprefix("unix:"))
    assert not dead.exists() and not reused.exists()
    assert link.is_symlink() and live.exists()


def test_a_directory_not_its_owners_alone_is_not_read(runs: Path,
                                                      sockets: list[socket.socket]) -> None:
    bound(runs / f"run-{os.getpid()}.sock", sockets)
    with open_runs([(str(runs), os.geteuid() + 1)]) as found:
        assert found == []  # not owned by the user it is named for
    link = runs.parent / "link"
    link.symlink_to(runs)
    with open_runs([(str(link), os.geteuid())]) as found:
        assert found == []
    runs.chmod(0o733)
    with open_runs([(str(runs), os.geteuid())]) as found:
        assert found == []


def _job(job_id: str, *pids: int) -> Any:
    return {"job_id": job_id, "ranks": [{"host": "n", "pid": pid} for pid in pids]}


def test_each_job_is_listed_once_by_the_first_source_that_follows_its_processes() -> None:
    run = Source("watchdog run, pid 7, user alice", "unix:/x")
    service = Source("coordinator at 127.0.0.1:29450", "127.0.0.1:29450")
    merged = merge([Answer(run, [_job("a", 10, 11), _job("c", 20)]),
                    Answer(service, [_job("a", 11, 12), _job("b", 13), _job("c", 21)])])
    assert [(m.source, [j["job_id"] for j in m.jobs]) for m in merged] == [
        (run, ["a", "c"]), (service, ["b", "c"])]  # another "c": other processes, both shown
    text = render_answers([Answer(run, [])], color=False)
    assert text == "== watchdog run, pid 7, user alice\nno jobs"
