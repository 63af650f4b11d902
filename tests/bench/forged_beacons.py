"""What forged beacons cost the root agent (a script, not a test; run it as root):
`python -m tests.bench.forged_beacons [--files 2] [--seconds 12] [--interval 1]`.

A real coordinator and a real agent as root, one real (fake) worker of `nobody`'s to report;
after a quiet spell `nobody` writes forged beacons (tests/security/beacon_forger.py: 16
whole-world groups each; half claim 2^20 ranks and name the agent, half the largest world a job
may have and name another user's process) and rewrites them every second, then stops. Printed
each second: the node reports the coordinator took in it and the agent's memory (VmRSS); then
the agent's peak memory (VmHWM) and its report rate before, during and after the attack.
Target: the agent stays under 200 MB and reports as often during the attack as before it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

from tests.helpers.attack import (
    AS_DAEMON,
    AS_NOBODY,
    Daemon,
    agent,
    coordinator,
    forged_beacons,
    job,
    memory_mib,
    reports_taken,
    scratch_dir,
    wait_for,
    worker,
)
from watchdog.beacon import MAX_WORLD
from watchdog.cli.demo import free_port

TARGET_MIB = 200


def spell(name: str, node: Daemon, metrics: int, seconds: int) -> float:
    """Print each second of a spell; its report rate, per second."""
    first = last = reports_taken(metrics)
    for second in range(1, seconds + 1):
        time.sleep(1.0)
        taken = reports_taken(metrics)
        print(f"{name:<7} {second:3d} s  {taken - last:3.0f} reports  "
              f"{memory_mib(node.proc.pid):6.0f} MiB", flush=True)
        last = taken
    return (last - first) / seconds


def attack(scratch: Path, files: int, seconds: int, interval: float) -> None:
    beacons = scratch / "torch-hang-watchdog"
    metrics = free_port()
    other_user = subprocess.Popen([*AS_DAEMON, "sleep", "3600"], cwd="/")
    try:
        with coordinator(scratch, "--metrics-listen", f"127.0.0.1:{metrics}") as coord, \
                worker({"beacon_dir": str(beacons), "job": "control", "rank": 0, "world": 1},
                       AS_NOBODY), \
                agent(scratch, beacons, "--coordinator", coord.address,
                      "--interval", str(interval)) as node:
            wait_for(lambda: job(coord.address, "control"), "the agent's first report")
            claims = [(node.proc.pid, 1 << 20) if n % 2 == 0 else (other_user.pid, MAX_WORLD)
                      for n in range(files)]
            before = spell("before", node, metrics, seconds // 2)
            with forged_beacons(beacons, seconds, claims):
                during = spell("attack", node, metrics, seconds)
            after = spell("after", node, metrics, seconds // 2)
            peak = memory_mib(node.proc.pid, "VmHWM")
    finally:
        other_user.kill()
        other_user.wait()
    print(f"{files} forged beacons rewritten every second for {seconds} s: agent peak memory "
          f"{peak:.0f} MiB (target < {TARGET_MIB}); reports a second before {before:.2f}, "
          f"during {during:.2f} ({during / before:.0%} of before), after {after:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--interval", type=float, default=1.0, help="the agent's")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the agent under test is root's, the forger `nobody`")
    with scratch_dir() as scratch:
        attack(scratch, args.files, args.seconds, args.interval)


if __name__ == "__main__":
    main()
