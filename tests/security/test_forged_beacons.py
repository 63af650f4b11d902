"""Attack 4, forged beacons: a beacon an unprivileged user writes naming a root process (one
with RANK in its environment) is not believed, so that process is never attached to; forged
beacons that claim a huge world, rewritten every second, cost the agent neither its report rate
nor its memory; and a rank the user forges into another user's job, claiming a world larger than
the job's, is flagged while the victim job is still judged."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

from tests.helpers.attack import (
    AS_DAEMON,
    AS_NOBODY,
    Daemon,
    agent,
    clean_env,
    coordinator,
    forged_beacons,
    hung_job,
    job,
    memory_mib,
    reports_taken,
    scratch_dir,
    shared_base,
    verdict,
    wait_for,
    worker,
)
from watchdog.beacon import MAX_WORLD
from watchdog.cli.demo import free_port

BASELINE_S, ATTACK_S = 5.0, 12.0


def test_a_beacon_naming_a_root_process_is_not_believed() -> None:
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
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
        beacons = shared_base(scratch)
        rank0, rank1 = hung_job(beacons, "victim")
        forged = {"beacon_dir": str(beacons), "job": "victim", "rank": 0, "world": 100_000,
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
    assert (flag["rank"], flag["world_size"]) == (0, 100_000)
    assert "claims world size 100000; the job's is 2" in flag["reason"]


@dataclass(frozen=True)
class Watched:
    rate: float  # node reports the coordinator took, per second
    peak_memory: float  # the agent's so far (VmHWM), MiB


def watch(node: Daemon, metrics: int, seconds: float) -> Watched:
    """The agent's report rate over the next `seconds`, and its peak memory by their end."""
    start, taken = time.monotonic(), reports_taken(metrics)
    time.sleep(seconds)
    return Watched((reports_taken(metrics) - taken) / (time.monotonic() - start),
                   memory_mib(node.proc.pid, "VmHWM"))


def test_forged_beacons_claiming_a_huge_world_cost_the_agent_nothing() -> None:
    """Two forgeries of 16 whole-world groups each, rewritten every second: one of 2^20 ranks
    naming the root agent itself, one of the largest world a job may have naming another user's
    process. Neither is believed, and the agent reports as often, and holds as little memory, as
    before them."""
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
        metrics = free_port()
        other_user = subprocess.Popen([*AS_DAEMON, "sleep", "600"], cwd="/")
        try:
            with coordinator(scratch, "--metrics-listen", f"127.0.0.1:{metrics}") as coord, \
                    worker({"beacon_dir": str(beacons), "job": "control", "rank": 0,
                            "world": 1}, AS_NOBODY), \
                    agent(scratch, beacons, "--coordinator", coord.address) as node:
                wait_for(lambda: job(coord.address, "control"), "the control job")
                before = watch(node, metrics, BASELINE_S)
                claims = [(node.proc.pid, 1 << 20), (other_user.pid, MAX_WORLD)]
                with forged_beacons(beacons, ATTACK_S, claims) as (huge, largest):
                    during = watch(node, metrics, ATTACK_S)
                assert job(coord.address, "forged") is None
                log = node.output()
        finally:
            other_user.kill()
            other_user.wait()
    assert during.rate >= 0.8 * before.rate, f"reports a second {before} -> {during}"
    assert during.peak_memory - before.peak_memory < 100, f"agent memory {before} -> {during}"
    assert f"ignoring {huge}: not a verified worker: rank 0 of world size 1048576" in log, log
    assert (f"ignoring {largest}: not a verified worker: process {other_user.pid} does not run "
            "as the beacon's owner") in log, log
