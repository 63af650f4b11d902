"""Attack 2, the beacon directory: a user who makes it first, or plants links in it, can neither
make root's hook write through a link nor keep other users' hooks off; with the directory root
makes at boot (deploy/systemd/torch-hang-watchdog.tmpfiles.conf), every user gets one of their
own. And a root agent finds every user's ranks in theirs."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from agent.table import WorkerTable
from tests.helpers.attack import AS_DAEMON, AS_NOBODY, NOBODY, clean_env, scratch_dir, worker
from tests.helpers.everyone import python

HOOKED = ("import os, sys, watchdog\n"
          "print(os.getpid(), flush=True)\n"
          "sys.stdin.readline()\n"  # the attacker plants its links now
          "print(watchdog.install(), flush=True)\n"
          "sys.stdin.readline()\n")
JOB = "victim-job"


def as_nobody(*argv: str) -> None:
    subprocess.run([*AS_NOBODY, *argv], check=True, cwd="/")


def hooked(base: Path, user: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen([*user, python(), "-c", HOOKED], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                            env=clean_env(RANK="0", WORLD_SIZE="1", WATCHDOG_JOB_ID=JOB,
                                          WATCHDOG_BEACON_DIR=str(base)))


def test_links_planted_in_a_directory_a_user_made_never_redirect_roots_beacon(
        tmp_path: Path) -> None:
    victim = tmp_path / "root-owned"
    victim.write_text("root's data\n")
    before = victim.stat()
    with scratch_dir() as scratch:
        base = scratch / "torch-hang-watchdog"
        rank = hooked(base)
        assert rank.stdout is not None and rank.stdin is not None
        pid = int(rank.stdout.readline())
        # The attacker made the directory first, world-writable, and planted a link at every
        # name root's beacon could take: the old flat one, in root's subdirectory (which the
        # attacker also made) and the temporary name it is created under.
        name = f"{JOB}.rank0.pid{pid}.beacon"
        as_nobody("mkdir", "-m", "0777", str(base))
        as_nobody("mkdir", "-m", "0777", str(base / "0"))
        for link in (base / name, base / "0" / name, base / "0" / f".{name}.new"):
            as_nobody("ln", "-s", str(victim), str(link))
        try:
            rank.stdin.write("\n")
            rank.stdin.flush()
            installed = rank.stdout.readline().strip()
            beacons = sorted(p.relative_to(base) for p in base.glob("*/*.beacon")
                             if not p.is_symlink())
        finally:
            rank.communicate("\n", timeout=30)
    assert victim.read_text() == "root's data\n"
    assert victim.stat().st_mtime_ns == before.st_mtime_ns
    # A base nobody made is nobody's to move aside: root's hook refuses it (issue 37, finding 6).
    assert installed == "False" and beacons == []  # only the links nobody planted


def test_a_directory_one_user_made_0755_stops_the_others_with_the_fix() -> None:
    with scratch_dir() as scratch:
        base = scratch / "torch-hang-watchdog"
        as_nobody("mkdir", "-m", "0755", str(base))
        rank = hooked(base, AS_DAEMON)
        out, err = rank.communicate("\n\n", timeout=60)
    assert rank.returncode == 0
    assert out.split()[1] == "False"
    assert err.count("\n") == 1  # one line, and training went on
    assert "hook not installed: the beacon directory" in err
    assert f"belongs to uid {NOBODY} (mode 755), who can move it aside" in err
    assert "torch-hang-watchdog.tmpfiles.conf" in err


def test_in_the_directory_root_makes_at_boot_every_user_has_their_own(tmp_path: Path) -> None:
    with scratch_dir() as scratch:
        base = scratch / "torch-hang-watchdog"
        base.mkdir()
        base.chmod(0o1777)  # what the tmpfiles.d entry makes
        as_nobody("mkdir", "-m", "0755", str(base / "1"))  # squats the user daemon's name
        specs = {user: {"beacon_dir": str(base), "job": f"job-of-{user}", "rank": 0, "world": 1}
                 for user in ("nobody", "daemon")}
        with worker(specs["nobody"], AS_NOBODY), worker(specs["daemon"], AS_DAEMON):
            table = WorkerTable(str(base), scan_unhooked=False)
            table.refresh(time.time())
            found = {w.identity.job_id: Path(w.beacon_path) for w in table.workers()}
            assert sorted(found) == ["job-of-daemon", "job-of-nobody"]
            assert found["job-of-nobody"].parent == base / str(NOBODY)
            assert found["job-of-daemon"].parent.name.startswith("1-")  # "1" was squatted
            assert found["job-of-daemon"].parent.stat().st_uid == 1
            assert {p.stat().st_mode & 0o777 for p in found.values()} == {0o644}
