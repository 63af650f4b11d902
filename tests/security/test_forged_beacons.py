"""Attack 4, forged beacons: a beacon an unprivileged user writes naming a root process (one
with RANK in its environment) is not believed, so that process is never attached to; and a rank
the user forges into another user's job, claiming a world of 1,000,000, is flagged while the
victim job is still judged."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.attack import (
    AS_NOBODY,
    agent,
    clean_env,
    coordinator,
    hung_job,
    job,
    scratch_dir,
    verdict,
    wait_for,
    worker,
)


def test_a_beacon_naming_a_root_process_is_not_believed() -> None:
    with scratch_dir() as scratch:
        beacons = scratch / "torch-hang-watchdog"
        root_process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], cwd="/",
            env=clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", WATCHDOG_JOB_ID="forged"))
        forged = {"beacon_dir": str(beacons), "job": "forged", "rank": 0, "world": 1,
                  "pid": root_process.pid}
        try:
            with coordinator(scratch) as coord, worker(forged, AS_NOBODY), \
                    agent(scratch, beacons, "--coordinator", coord.address) as node, \
                    worker({"beacon_dir": str(beacons), "job": "control", "rank": 0,
                            "world": 1}, AS_NOBODY):
                # The control job of the same user is verified and reported: the forged one,
                # found in the same scans, never is.
                wait_for(lambda: job(coord.address, "control"), "the control job")
                assert job(coord.address, "forged") is None
                log = node.output()
        finally:
            root_process.kill()
            root_process.wait()
    assert (f"not a verified worker: process {root_process.pid} does not run as the beacon's "
            "owner") in log


def test_a_forged_rank_with_a_huge_world_cannot_stop_the_victim_being_judged() -> None:
    with scratch_dir() as scratch:
        beacons = scratch / "torch-hang-watchdog"
        rank0, rank1 = hung_job(beacons, "victim")
        forged = {"beacon_dir": str(beacons), "job": "victim", "rank": 0, "world": 1_000_000,
                  "steps": 99}
        # The forgery is seen first: its world size would be the job's.
        with coordinator(scratch) as coord, worker(forged, AS_NOBODY), \
                agent(scratch, beacons, "--coordinator", coord.address):
            wait_for(lambda: job(coord.address, "victim"), "the forged rank to be reported")
            with worker(rank0), worker(rank1):
                view = verdict(coord.address, "victim")
    assert view["world_size"] == 2
    assert view["verdict"]["kind"] == "MISSING_RANKS"
    assert view["verdict"]["culprit_ranks"] == [1]
    (flag,) = view["flagged"]
    assert (flag["rank"], flag["world_size"]) == (0, 1_000_000)
    assert "claims world size 1000000; the job's is 2" in flag["reason"]
