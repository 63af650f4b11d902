"""What the agent's progress evidence costs and shows (a script, not a test):
`python -m tests.bench.agent_report [--ranks 8] [--reports 400]`.

(a) The agent's CPU per report for N local ranks: each rank a real process with a real beacon
    (written by BeaconWriter, published 5 times a second, as the hook does), each report reading
    every beacon and, from /proc, each process's state, CPU (whole and main thread) and I/O
    counters. The same reports without the /proc evidence give the difference it makes.
(b) What that evidence looks like for the workloads busy and hung ranks do: blocked on a lock,
    asleep in a read, computing, writing with fsync, spinning in a livelock, polling with sleep.
    A rank counts as busy above 5% of a core on its main thread, 10% in the whole process or
    64 KiB/s of I/O (watchdog/coordinator/evidence.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent import activity, procfs
from agent.daemon import Agent

REPO = Path(__file__).resolve().parents[2]

RANK = """
import os, sys, threading, time
from watchdog.beacon import BeaconWriter, Identity, beacon_path
rank = int(sys.argv[2])
identity = Identity("bench", rank, rank, int(sys.argv[3]), "host", os.getpid(), time.time())
writer = BeaconWriter(beacon_path(sys.argv[1], "bench", rank, os.getpid()), identity)
while True:
    writer.publish(0, [], {}, time.time())
    writer.heartbeat(time.time())
    time.sleep(0.2)
"""
WORKLOADS = {
    "blocked on a lock": "import threading; l = threading.Lock(); l.acquire(); l.acquire()",
    "asleep in a read": "import time; time.sleep(3600)",
    "computing": "while True: pass",
    "writing, fsync": ("import os, tempfile\nf = tempfile.TemporaryFile()\nc = os.urandom(1<<20)\n"
                       "while True:\n    f.write(c); f.flush(); os.fsync(f.fileno())\n"
                       "    f.seek(0) if f.tell() > 64 << 20 else None"),
    "polling, sleep(0.05)": "import time\nwhile True: time.sleep(0.05)",
}


def report_cost(ranks: int, reports: int) -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        own = Path(d) / str(os.geteuid())  # a user's own directory, as the hook makes it
        own.mkdir(mode=0o755)
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(own), str(r), str(ranks)],
                                  env={**os.environ, "RANK": str(r), "PYTHONPATH": str(REPO)})
                 for r in range(ranks)]
        try:
            while len(list(own.glob("*.beacon"))) < ranks:
                time.sleep(0.05)
            agent = Agent(None, d, "bench", scan_unhooked=False)
            whole = per_report(agent.scan, reports)
            pids = [w.identity.pid for w in agent.table.workers()]
            assert len(pids) == ranks, f"the agent verified {len(pids)} of {ranks} ranks"
            evidence = per_report(lambda: [sample(pid) for pid in pids], reports)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    print(f"(a) agent CPU per report, {ranks} ranks: {whole * 1e3:.2f} ms (target <= 5 ms), "
          f"of which the /proc progress evidence {evidence * 1e3:.2f} ms")


def per_report(report: Callable[[], object], reports: int) -> float:
    """Median CPU seconds of one call, over batches of 20 calls."""
    batches = []
    for _ in range(reports // 20):
        start = time.process_time()
        for _ in range(20):
            report()
        batches.append((time.process_time() - start) / 20)
    return statistics.median(batches)


def workloads(seconds: float) -> None:
    print(f"(b) evidence over {seconds:.0f} s (main-thread cores, process cores, read/write "
          "bytes a second, states seen):")
    for name, code in WORKLOADS.items():
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.5)
            first, states = sample(proc.pid), set()
            end = time.time() + seconds
            while time.time() < end:
                stat = procfs.read_stat(proc.pid)
                states.add(stat.state if stat else "?")
                time.sleep(0.1)
            rates = activity.rates(first, sample(proc.pid))
            print(f"    {name:<22} main {rates.main_cpu:5.2f}  process {rates.process_cpu:5.2f}"
                  f"  read {rates.read_rate:>12,.0f}  write {rates.write_rate:>14,.0f}  "
                  f"states {''.join(sorted(states))}")
        finally:
            proc.kill()
            proc.wait()


def sample(pid: int) -> activity.Reading:
    stat = procfs.read_stat(pid)
    assert stat is not None
    return activity.read(pid, time.time(), stat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--reports", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=3.0, help="per workload in (b)")
    args = parser.parse_args()
    report_cost(args.ranks, args.reports)
    workloads(args.seconds)


if __name__ == "__main__":
    main()
