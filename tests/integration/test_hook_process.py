"""The hook in real processes: what real ranks leave in their beacons (a 2-rank torchrun probe
job), and how installing, exiting, forking and the boot sitecustomize behave."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from watchdog.beacon import (
    CHECK_NAMES,
    EXIT_CLEAN,
    EXIT_EXCEPTION,
    EXIT_RUNNING,
    BeaconGroup,
    BeaconSnapshot,
    open_beacon,
    read_beacon,
)
from watchdog.cli.demo import free_port
from watchdog.hook.checks import FIRST_CHECK
from watchdog.hook.lifecycle import EXIT_GRACE_S, EXITING
from watchdog.supervise.inject import BOOT_DIR

REPO = Path(__file__).resolve().parents[2]
BOOT = BOOT_DIR
SPAWN_STEPS = FIRST_CHECK + 1  # the first check's batch comes with the step after it
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "WATCHDOG_HOOK_PID", "WATCHDOG_AUTOINSTALL")


def hooked_env(beacon_dir: Path, **extra: str) -> dict[str, str]:
    """The environment `watchdog run` gives a job: boot dir first on PYTHONPATH, auto-install."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env.update(WATCHDOG_BEACON_DIR=str(beacon_dir), WATCHDOG_AUTOINSTALL="1",
               WATCHDOG_JOB_ID="test-job", PYTHONPATH=f"{BOOT}:{REPO}", **extra)
    return env


def beacons(beacon_dir: Path) -> dict[int, BeaconSnapshot]:
    snaps = [read_beacon(open_beacon(p)) for p in glob.glob(f"{beacon_dir}/*/*.beacon")]
    return {s.identity.rank: s for s in snaps}


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/jobs/hook_probe.py run once by torchrun, 2 ranks on gloo, hook auto-installed."""
    tmp = tmp_path_factory.mktemp("probe")
    out = tmp / "out"
    out.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         f"--master_port={free_port()}", str(REPO / "tests" / "jobs" / "hook_probe.py")],
        env=hooked_env(tmp / "beacons", PROBE_OUT=str(out)), capture_output=True, text=True,
        timeout=180, cwd=tmp)
    assert run.returncode == 0, run.stdout + run.stderr
    return {"files": sorted(glob.glob(f"{tmp}/beacons/*/*")), "beacons": beacons(tmp / "beacons"),
            "ranks": {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}}


def test_probe_ranks_leave_exact_progress(probe: dict[str, Any]) -> None:
    snaps: dict[int, BeaconSnapshot] = probe["beacons"]
    assert sorted(snaps) == [0, 1]
    for rank, snap in snaps.items():
        assert (snap.identity.rank, snap.identity.local_rank, snap.identity.world_size) == (
            rank, rank, 2)
        assert snap.identity.job_id == "test-job"
        assert snap.steps == 3
        assert (snap.exit_state, snap.exit_code) == (EXIT_CLEAN, 0)
        assert snap.phase == "shutdown"  # declared by destroy_process_group, for the exit
        assert snap.phase_timeout > 0
        world = snap.groups[0]
        # DDP's constructor's shape check and broadcast, 3 DDP forwards with grad (not the
        # no_grad one), all_reduce, broadcast_object_list (its inner broadcasts not counted),
        # the all_reduce that raised, an async all_reduce, the barrier
        assert (world.name, world.ranks, world.op) == ("0", range(2), "barrier")
        assert (world.entered_seq, world.completed_seq) == (10, 10)
        assert probe["ranks"][rank]["after_ddp"] == ["ddp_init", 2, 2]
    # the pair's slot: send, isend, then a batch of isend and irecv (rank 1: the mirror image),
    # each async one completed by its wait
    assert list(snaps[0].groups[1:]) == [
        BeaconGroup("1", (0,), "all_reduce", 1, snaps[0].groups[1].entered_at, 1),
        BeaconGroup("0:p2p:0-1", range(2), "irecv", 4, snaps[0].groups[2].entered_at, 4),
    ]
    # rank 1 is not in group "1"; its receive from any source is placed once the sender is known
    assert [(g.name, g.ranks, g.op, g.entered_seq, g.completed_seq)
            for g in snaps[1].groups[1:]] == [("0:p2p:0-1", range(2), "isend", 4, 4)]
    for rank in (0, 1):  # an isend or irecv completes when its wait() returns
        assert probe["ranks"][rank]["p2p_after_wait"] == [2, 2]


def test_only_ranks_write_beacons(probe: dict[str, Any]) -> None:
    """Forked DataLoader workers declared a phase and read the rank's beacon: it never showed.
    A Python child of a rank does not install a hook of its own."""
    assert len(probe["files"]) == 2
    for rank in (0, 1):
        assert probe["ranks"][rank]["worker_writes"] == 0
        assert probe["ranks"][rank]["child_install"] == "False"


def test_phases_nest_and_restore(probe: dict[str, Any]) -> None:
    for rank in (0, 1):
        assert probe["ranks"][rank]["phases"] == ["checkpoint", "upload", "checkpoint", ""]


def test_user_error_in_a_collective_reaches_the_user_unchanged(probe: dict[str, Any]) -> None:
    for rank in (0, 1):
        errors = probe["ranks"][rank]["errors"]
        assert errors["hooked"][0] == "TypeError"
        assert errors["hooked"] == errors["unhooked"]


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


def test_installed_rank_records_steps_and_clean_exit(tmp_path: Path) -> None:
    code = ("import sys, watchdog; assert 'torch' not in sys.modules\n"
            "print(watchdog.install(), watchdog.install())\n"
            "watchdog.step(); watchdog.step()")
    run = run_python(code, hooked_env(tmp_path, RANK="1", WORLD_SIZE="4"))
    assert run.stdout.split() == ["True", "True"], run.stderr
    (snap,) = beacons(tmp_path).values()
    assert (snap.identity.rank, snap.identity.world_size, snap.identity.local_rank) == (1, 4, -1)
    assert (snap.steps, snap.exit_state, snap.exit_code) == (2, EXIT_CLEAN, 0)
    assert snap.heartbeat > 0


def test_publisher_thread_shows_progress_while_the_rank_runs(tmp_path: Path) -> None:
    code = ("import glob, os, time, watchdog\n"
            "from watchdog.beacon import open_beacon, read_beacon\n"
            "watchdog.install(); watchdog.step(); watchdog.step()\n"
            "(path,) = glob.glob(os.environ['WATCHDOG_BEACON_DIR'] + '/*/*.beacon')\n"
            "deadline = time.monotonic() + 10\n"
            "while read_beacon(open_beacon(path)).steps < 2 and time.monotonic() < deadline:\n"
            "    time.sleep(0.01)\n"
            "snap = read_beacon(open_beacon(path))\n"
            "print(snap.steps, snap.exit_state, snap.heartbeat >= snap.step_at > 0)")
    run = run_python(code, hooked_env(tmp_path, RANK="0", WORLD_SIZE="1"))
    assert run.stdout.split() == ["2", str(EXIT_RUNNING), "True"], run.stderr


def test_uncaught_exception_marks_the_exit_and_still_reaches_the_previous_hook(
        tmp_path: Path) -> None:
    run = run_python("raise KeyError('boom')", hooked_env(tmp_path, RANK="0", WORLD_SIZE="1"))
    assert run.returncode == 1
    assert "KeyError: 'boom'" in run.stderr
    (snap,) = beacons(tmp_path).values()
    assert (snap.exit_state, snap.exit_code) == (EXIT_EXCEPTION, 1)


@pytest.mark.parametrize("leave", ["sys.exit(3)", "sys.exit(256 + 7)", "sys.exit('bad config')",
                                   "sys.exit()", "sys.exit(None)"])
def test_the_code_sys_exit_asks_for_reaches_the_beacon(tmp_path: Path, leave: str) -> None:
    run = run_python(f"import sys, watchdog\nwatchdog.step()\n{leave}",
                     hooked_env(tmp_path, RANK="0", WORLD_SIZE="1"))
    (snap,) = beacons(tmp_path).values()
    assert (snap.exit_state, snap.exit_code) == (EXIT_CLEAN, run.returncode), run.stderr


@pytest.mark.parametrize("leave", ["raise KeyError('boom')", "sys.exit(3)"])
def test_a_leaving_rank_is_exiting_from_its_exit_until_its_teardown_is_done(
        tmp_path: Path, leave: str) -> None:
    """Its peers wait while its exit handlers run (a logger's upload: 0.3 s here) and the
    interpreter tears down after the hook's own, the last: a phase from the exit, armed afresh
    at the hook's handler."""
    code = ("import atexit, glob, os, sys, time, watchdog\n"
            "from watchdog.beacon import open_beacon, read_beacon\n"
            "def upload():\n"
            "    (path,) = glob.glob(os.environ['WATCHDOG_BEACON_DIR'] + '/*/*.beacon')\n"
            "    snap = read_beacon(open_beacon(path))\n"
            "    print(snap.phase, repr(snap.phase_started), repr(LEFT_AT))\n"
            "    time.sleep(0.3)\n"
            "atexit.register(upload)\n"
            "watchdog.step()\n"
            f"LEFT_AT = time.time()\n{leave}")
    run = run_python(code, hooked_env(tmp_path, RANK="0", WORLD_SIZE="2"))
    phase, started, left_at = run.stdout.split()
    assert phase == EXITING, run.stderr
    assert float(left_at) <= float(started) < float(left_at) + 0.3
    (snap,) = beacons(tmp_path).values()
    assert (snap.phase, snap.phase_timeout) == (EXITING, EXIT_GRACE_S)
    assert snap.phase_started >= float(started) + 0.3  # after the upload: the teardown's own


def test_sys_exit_in_another_thread_ends_only_that_thread(tmp_path: Path) -> None:
    code = ("import sys, threading, watchdog\n"
            "thread = threading.Thread(target=sys.exit, args=(5,)); thread.start(); thread.join()")
    run = run_python(code, hooked_env(tmp_path, RANK="0", WORLD_SIZE="1"))
    assert run.returncode == 0, run.stderr
    (snap,) = beacons(tmp_path).values()
    assert (snap.exit_state, snap.exit_code) == (EXIT_CLEAN, 0)


def test_the_publisher_has_stopped_before_the_interpreter_finalizes(tmp_path: Path) -> None:
    """A daemon thread still inside torch when the interpreter finalizes aborts the process
    (seen at the end of healthy jobs); exit handlers run last-registered first, so one
    registered before the hook runs after the hook's own."""
    code = ("import atexit, threading, watchdog\n"
            "from watchdog.hook.lifecycle import PUBLISHER_THREAD\n"
            "atexit.register(lambda: print(PUBLISHER_THREAD in [t.name for t in "
            "threading.enumerate()]))\n"
            "print(watchdog.install()); watchdog.step()")
    env = hooked_env(tmp_path, RANK="0", WORLD_SIZE="1")
    del env["WATCHDOG_AUTOINSTALL"]  # installed by the code, after its own exit handler
    run = run_python(code, env)
    assert run.stdout.split() == ["True", "False"], run.stderr
    (snap,) = beacons(tmp_path).values()
    assert (snap.steps, snap.exit_state, snap.exit_code) == (1, EXIT_CLEAN, 0)


def test_forked_child_never_writes_the_rank_beacon(tmp_path: Path) -> None:
    code = ("import os, sys, watchdog\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    watchdog.step(); print(watchdog.install()); sys.exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "import glob; from watchdog.beacon import open_beacon, read_beacon\n"
            "(path,) = glob.glob(os.environ['WATCHDOG_BEACON_DIR'] + '/*/*.beacon')\n"
            "snap = read_beacon(open_beacon(path))\n"
            "print(snap.steps, snap.exit_state)")
    run = run_python(code, hooked_env(tmp_path, RANK="0", WORLD_SIZE="1"))
    assert run.stdout.split() == ["False", "0", str(EXIT_RUNNING)], run.stderr


def test_install_by_hand_after_torch_is_set_up(tmp_path: Path) -> None:
    code = ("import torch, torch.distributed as dist, watchdog\n"
            "dist.init_process_group('gloo', rank=0, world_size=1)\n"
            "print(watchdog.install())\n"
            "dist.all_reduce(torch.ones(1), group=dist.new_group([0]))\n"
            "dist.destroy_process_group()")
    env = hooked_env(tmp_path, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()))
    env["PYTHONPATH"] = str(REPO)  # no boot: the script installs the hook itself
    run = run_python(code, env)
    assert run.stdout.split() == ["True"], run.stderr
    (snap,) = beacons(tmp_path).values()
    assert [(g.name, g.ranks, g.op, g.entered_seq, g.completed_seq) for g in snap.groups] == [
        ("0", range(1), "", 0, 0), ("1", range(1), "all_reduce", 1, 1)]  # the whole world


def test_boot_never_stops_the_program_and_runs_the_sitecustomize_it_shadows(
        tmp_path: Path) -> None:
    shadowed = tmp_path / "site"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text("print('shadowed sitecustomize ran')\n")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    env = hooked_env(not_a_dir, RANK="0", WORLD_SIZE="1")
    env["PYTHONPATH"] = f"{BOOT}:{shadowed}:{REPO}"
    run = run_python("print('user code ran')", env)
    assert run.returncode == 0
    assert run.stdout.splitlines() == ["shadowed sitecustomize ran", "user code ran"]
    assert run.stderr.startswith("torch-hang-watchdog: hook not installed: ")
    assert len(run.stderr.splitlines()) == 1


def test_spawned_ranks_record_as_the_rank_init_process_group_gives_them(tmp_path: Path) -> None:
    """torch.multiprocessing.spawn with a tcp:// init method: no RANK anywhere; the rank and
    world size reach the hook through init_process_group's arguments (test_start_up runs one
    with env://). The parent, armed too, writes no beacon. The checks, which the patches bind
    when torch is imported, before the process knows it is a rank, run too: rank 0 loads other
    weights after DDP wrapped its model, and its parameters' fingerprint differs."""
    run = subprocess.run(
        [sys.executable, str(REPO / "tests" / "jobs" / "spawn_job.py"), "--nproc", "2",
         "--init-method", "tcp", "--steps", str(SPAWN_STEPS), "--mistake", "load_after_ddp"],
        env=hooked_env(tmp_path), capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    snaps = beacons(tmp_path)
    assert sorted(snaps) == [0, 1] and len(list(tmp_path.glob("*/*.beacon"))) == 2
    for rank, snap in snaps.items():
        assert (snap.identity.rank, snap.identity.world_size, snap.identity.job_id) == (
            rank, 2, "test-job")
        assert (snap.exit_state, snap.exit_code, snap.steps) == (EXIT_CLEAN, 0, SPAWN_STEPS)
        assert snap.setup.call == ""  # it left init_process_group long ago
        # DDP's constructor's shape check and broadcast, then its forwards
        assert snap.groups[0].name == "0" and snap.groups[0].entered_seq == 2 + SPAWN_STEPS
        assert snap.checks.enabled == CHECK_NAMES
        assert sorted((fp.of, fp.step) for fp in snap.checks.fingerprints) == [
            ("batch", FIRST_CHECK), ("parameters", FIRST_CHECK)]
    (mine,), (theirs,) = ([fp.digest for fp in snaps[r].checks.fingerprints
                           if fp.of == "parameters"] for r in (0, 1))
    assert mine != theirs
