"""Attack 3, crashing or stalling the agent: a user truncates and regrows their own beacon after
the agent read it, and fills their directory with a FIFO, a link, a directory and junk, all named
*.beacon. The root agent stays alive, keeps reporting the other jobs, and logs no traceback."""

from __future__ import annotations

import subprocess

from tests.helpers.attack import (
    AS_NOBODY,
    NOBODY,
    agent,
    coordinator,
    job,
    scratch_dir,
    shared_base,
    wait_for,
    worker,
)
from watchdog.beacon import SIZE


def as_nobody(script: str) -> None:
    subprocess.run([*AS_NOBODY, "sh", "-c", script], check=True, cwd="/")


def test_truncated_beacons_fifos_and_junk_leave_the_agent_reporting() -> None:
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
        spec = {"beacon_dir": str(beacons), "rank": 0, "world": 1}
        with coordinator(scratch) as coord, worker({**spec, "job": "attacker"}, AS_NOBODY), \
                agent(scratch, beacons, "--coordinator", coord.address) as node:
            wait_for(lambda: job(coord.address, "attacker"), "the agent to read the beacon")
            mine = beacons / str(NOBODY)
            (path,) = mine.glob("attacker.*.beacon")
            # Truncated under the agent, then grown back to the size it expects; then a FIFO,
            # a link to a root-only file, a directory and junk, each named like a beacon.
            as_nobody(f"truncate -s 0 {path}; sleep 0.5; truncate -s {SIZE} {path}")
            as_nobody(f"cd {mine} && mkfifo x.beacon && ln -s /etc/shadow shadow.beacon && "
                      f"mkdir dir.beacon && head -c {SIZE} /dev/urandom > junk.beacon && "
                      f"head -c 7 /dev/urandom > short.beacon")
            with worker({**spec, "job": "after-the-attack"}):
                wait_for(lambda: job(coord.address, "after-the-attack"),
                         "the agent to report a job started after the attack")
            assert node.alive, node.output()
            log = node.output()
    assert "Traceback" not in log
    for name in ("x.beacon", "shadow.beacon", "junk.beacon", "short.beacon"):
        assert f"ignoring {mine / name}" in log, log
    assert "rank 0 of attacker: beacon is now 0 bytes" in log, log
