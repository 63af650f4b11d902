"""Attack 1, file disclosure: an unprivileged user's "torchrun" worker names a root-only file as
its NCCL_DEBUG_FILE (and another has its stdout on one). The root agent attaches to them (they
are that user's own processes) but reads their files with their rights: the secret lines never
reach `watchdog status` or the incident database."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.helpers.attack import (
    AS_NOBODY,
    WATCHDOG,
    agent,
    clean_env,
    coordinator,
    scratch_dir,
    verdict,
)
from tests.helpers.everyone import python

SECRET = "SECRET-7f3a9c1e"
VISIBLE = "VISIBLE-b41d"
LAUNCHER = """
import os, subprocess, sys, time
secret, own, job, handed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sleep = ["python3", "-c", "import time\\nwhile True: time.sleep(1)"]
def env(rank, **extra):
    return dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="3",
                WATCHDOG_JOB_ID=job, **extra)
ranks = [subprocess.Popen(sleep, env=env(0, NCCL_DEBUG_FILE=secret)),
         subprocess.Popen(sleep, env=env(1), stdout=handed),
         subprocess.Popen(sleep, env=env(2, NCCL_DEBUG_FILE=own))]
print("launched", flush=True)
time.sleep(3600)
"""


def test_root_only_files_named_by_a_worker_are_never_read(tmp_path: Path) -> None:
    with scratch_dir() as scratch:
        secret = tmp_path / "root-only.log"  # tmp_path itself is 0700 root
        secret.write_text(f"node:1:2 [0] misc/socket.cc:49 NCCL WARN {SECRET} token\n" * 3)
        secret.chmod(0o600)
        launcher = scratch / "torchrun"  # its name is all it takes to look like torchrun
        launcher.write_text(LAUNCHER)
        own = scratch / "own-nccl.log"  # the user's own log: read, with the user's rights
        subprocess.run([*AS_NOBODY, "sh", "-c", f"echo 'n:1:2 [0] NCCL WARN {VISIBLE}' > {own}"],
                       check=True, cwd="/")
        with secret.open("a") as root_only, coordinator(scratch) as coord, \
                agent(scratch, scratch / "beacons", "--coordinator", coord.address) as node:
            # The user runs the job, pointed at this agent; the launcher was handed a root-only
            # file, open for appending, and gives it to rank 1 as its stdout.
            env = clean_env(WATCHDOG_BEACON_DIR=str(scratch / "beacons"))
            job = subprocess.Popen([*AS_NOBODY, python(), str(launcher), str(secret),
                                    str(own), "disclosure", str(root_only.fileno())],
                                   stdout=subprocess.PIPE, text=True, env=env, cwd="/",
                                   pass_fds=(root_only.fileno(),), start_new_session=True)
            try:
                assert job.stdout is not None and job.stdout.readline() == "launched\n"
                view = verdict(coord.address, "disclosure")
                incidents = subprocess.run([*WATCHDOG, "incidents", "list", "--json", "--db",
                                            str(scratch / "incidents.db")], capture_output=True,
                                           text=True, timeout=60, check=True).stdout
            finally:
                os.killpg(job.pid, signal.SIGKILL)  # the launcher and its three ranks
                job.wait()
            agent_log = node.output()
            assert node.alive
    rows = {row["rank"]: row for row in view["verdict"]["ranks"]}
    assert sorted(rows) == [0, 1, 2]
    assert all(row["stack"] for row in rows.values())  # attached: the user's own processes
    assert rows[2]["nccl_log"] == [f"n:1:2 [0] NCCL WARN {VISIBLE}"], agent_log
    assert SECRET not in str(view)
    assert SECRET not in incidents and "disclosure" in incidents
    assert "not reading" in agent_log and SECRET not in agent_log

