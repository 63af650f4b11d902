"""What `watchdog run` says it sees: the job and how many ranks report, why a command's
processes never report (read from their flags and environment), and a notice's end."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

import pytest

from tests.helpers.builders import rank
from watchdog.coordinator import StallPolicy
from watchdog.coordinator.jobs import JobView
from watchdog.supervise.inject import BOOT_DIR, hook_env
from watchdog.supervise.seen import (
    NOT_A_RANK,
    Process,
    Sighting,
    interpreter_flags,
    moved_on_text,
    partly_text,
    process_tree,
    sighting,
    unreported_text,
    watching_text,
    why_unhooked,
)

PY = "/usr/bin/python3.11"
HOOKED = hook_env({"PATH": "/usr/bin"}, "/dev/shm/beacons", "job")
WORKER = {**HOOKED, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}


def process(pid: int, *argv: str, env: Mapping[str, str] | None = WORKER,
            name: str = "python3.11") -> Process:
    return Process(pid, name, (PY, *argv), env)


def test_the_job_and_how_many_of_its_ranks_report() -> None:
    seen = Sighting("train-20261203-1200-ab12\x1b[2J", 4, frozenset({11, 12}))
    assert watching_text(seen) == ("watchdog: watching job train-20261203-1200-ab12\\x1b[2J: "
                                   "2 of 4 ranks report")
    workers = [process(11, "train.py"), process(13, "-S", "train.py")]
    lines = partly_text(seen, 60.0, workers).splitlines()
    assert lines[0].endswith("2 of 4 ranks report after 60 s; the others are not seen here (on "
                             "other nodes, not started yet, or without the hook)")
    assert lines[1] == ("watchdog:   1 torchrun worker (pid 13): started with python -S, which "
                        "skips the site module that loads the hook")


def test_the_job_seen_is_the_first_whose_ranks_all_report() -> None:
    first, second = JobView("j", StallPolicy()), JobView("j/attempt1", StallPolicy())
    assert sighting([first, second]) is None
    first.update("node-a", rank(0, job_id="j"))
    first.update("node-a", rank(1, job_id="j", hooked=False))  # seen by its stacks alone
    assert sighting([first, second]) == Sighting("j", 4, frozenset({4242}))
    for n in range(4):
        second.update("node-a", rank(n, job_id="j/attempt1"))
    seen = sighting([first, second])
    assert seen is not None and seen.job_id == "j/attempt1" and seen.complete


@pytest.mark.parametrize(("argv", "flags"), [
    (("train.py", "-S"), set()),
    (("-u", "-S", "train.py"), {"u", "S"}),
    (("-IuB", "-m", "torch.distributed.run"), {"I", "u", "B"}),
    (("-X", "dev", "-E", "train.py"), {"E"}),
    (("-Wignore", "-S", "-c", "pass"), {"S"}),
    (("-c", "-S"), set()),
])
def test_interpreter_flags_stop_at_the_script(argv: tuple[str, ...], flags: set[str]) -> None:
    assert interpreter_flags((PY, *argv)) == flags


@pytest.mark.parametrize(("proc", "why"), [
    (process(1, "-S", "t.py"), "started with python -S, which skips the site module"),
    (process(1, "-I", "t.py"), "started with python -I, which ignores PYTHONPATH"),
    (process(1, "t.py", env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}),
     "their environment was replaced (WATCHDOG_AUTOINSTALL is not in it)"),
    (process(1, "t.py", env={**WORKER, "PYTHONPATH": "/opt/lib"}),
     "their PYTHONPATH was replaced, without the hook's directory"),
    (process(1, "t.py"), "nothing keeps the hook out: their output says why"),
    (process(1, "t.py", env=HOOKED), NOT_A_RANK),
    (Process(1, "java", ("java", "-jar", "t.jar"), WORKER), "not Python (java)"),
    (process(1, "t.py", env=None), ""),
])
def test_why_a_process_does_not_report(proc: Process, why: str) -> None:
    assert why_unhooked(proc).startswith(why)


def test_nothing_reported_names_the_workers_by_reason_and_what_to_do() -> None:
    stripped = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "PATH": "/usr/bin"}
    text = unreported_text(60.0, [
        process(7, "-m", "torch.distributed.run", "t.py", env=HOOKED),  # torchrun: not a worker
        process(9, "t.py", env=stripped), process(8, "-S", "t.py")])
    lines = text.splitlines()
    assert lines[0] == ("watchdog: nothing the command started reported in 60 s: no rank of it "
                        "is watched, and no hang in it will be named (the job goes on untouched)")
    assert lines[1].startswith("watchdog:   1 torchrun worker (pid 8): started with python -S")
    assert lines[2].startswith("watchdog:   1 torchrun worker (pid 9): their environment was")
    assert "by their stacks alone" in lines[3]  # a node agent sees pid 9 without its hook
    assert "`watchdog launch -- CMD`" in lines[4] and "watchdog.install()" in lines[4]
    assert "`watchdog doctor`" in lines[4]
    assert len(lines) == 5


def test_when_no_process_shows_a_reason_the_likely_ones_are_listed() -> None:
    lines = unreported_text(60.0, [process(5, "t.py", env=None)]).splitlines()
    assert lines[1].startswith("watchdog:   likely no hook in the workers: a launcher or wrapper")
    assert "python -I, -E or -S" in lines[1] and "not Python" in lines[1]
    python_only = unreported_text(60.0, [process(5, "t.py", env=HOOKED)]).splitlines()
    assert python_only[1].endswith(NOT_A_RANK) and len(python_only) == 2  # a hook, no rank


def test_a_notice_that_ended_says_which_rank_moved_on_and_when() -> None:
    notice = {"id": "3f2a9c", "kind": "RANK_BUSY", "culprit_ranks": [0]}
    assert moved_on_text(notice, 41.4) == ("watchdog: rank 0 moved on after 41 s (RANK_BUSY "
                                           "notice 3f2a9c)")
    assert moved_on_text({**notice, "culprit_ranks": [0, 2]}, 9.6).startswith(
        "watchdog: ranks 0,2 moved on after 10 s")


def test_the_command_s_process_tree_is_read_from_proc() -> None:
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(30)"],
                             env=WORKER)
    try:
        tree = {p.pid: p for p in process_tree(os.getpid())}
    finally:
        child.kill()
        child.wait()
    seen = tree[child.pid]
    assert seen.python and seen.torchrun_worker and seen.argv[1:3] == ("-S", "-c")
    assert why_unhooked(seen).startswith("started with python -S")
    assert BOOT_DIR in (seen.env or {})["PYTHONPATH"]
