"""Issue 37, finding 6: where the tmpfiles entry is absent (the README's one-node set-up), the
first user's hook made the beacon base, so it was theirs: `nobody` moved it aside, and the next
user's job wrote its beacons where the agent never looked. Now the root agent makes the base
at start (root's, 1777: nobody may move it), and a hook refuses a base another user owns."""

from __future__ import annotations

import subprocess

from tests.helpers.attack import (
    AS_DAEMON,
    AS_NOBODY,
    agent,
    coordinator,
    job,
    scratch_dir,
    wait_for,
    worker,
)


def test_the_first_user_cannot_move_the_beacon_base_aside() -> None:
    with scratch_dir() as scratch, coordinator(scratch) as coord:
        base = scratch / "base"  # absent: no tmpfiles entry made it
        with agent(scratch, base, "--coordinator", coord.address):
            with worker({"beacon_dir": str(base), "job": "nobodys-job", "rank": 0, "world": 1},
                        AS_NOBODY):
                # aside, and a base of nobody's own in its place that no one else can write
                moved = subprocess.run([*AS_NOBODY, "sh", "-c", f"mv {base} {scratch}/aside && "
                                        f"mkdir -m 0755 {base}"], capture_output=True, text=True)
            owner = base.stat().st_uid
            with worker({"beacon_dir": str(base), "job": "daemons-job", "rank": 0, "world": 1},
                        AS_DAEMON):
                seen = wait_for(lambda: job(coord.address, "daemons-job"),
                                "the next user's job to be seen", 30)
    assert moved.returncode != 0, "nobody moved the beacon base aside"
    assert owner == 0 and seen is not None
