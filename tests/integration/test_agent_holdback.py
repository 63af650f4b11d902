"""A real agent at its defaults, following a rank of a large job (a real process writing a real
beacon), reporting to a real `watchdog coordinator` at its defaults: while the rank progresses,
one report in two is held back; once it stops, every report goes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

from agent.holdback import QUIET_WORLD
from tests.helpers.harness import WATCHDOG, job_env, stop_process
from tests.helpers.scrape import scrape, value
from tests.helpers.secured import coordinator
from watchdog.cli.demo import free_port

WINDOW_S = 8.0
FIRST_REPORT_S = 60.0
WORKER = """
import os, sys, threading, time
from watchdog.beacon import BeaconWriter, Identity, beacon_path
from watchdog.beacondir import user_dir
world, job = int(os.environ["WORLD_SIZE"]), "job-large"
fd, directory = user_dir(sys.argv[1])
writer = BeaconWriter(beacon_path(directory, job, 3, os.getpid()),
                      Identity(job, 3, 1, world, "host", os.getpid(), time.time()), fd)
stalled = threading.Event()

def train():
    steps = 0
    while True:
        now = time.time()
        steps += not stalled.is_set()
        writer.publish(steps, [], {}, now)
        writer.heartbeat(now)
        time.sleep(0.05)

threading.Thread(target=train, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
stalled.set()
sys.stdin.read()
"""


def reports(port: int) -> float:
    return value(scrape(port), "torch_hang_watchdog_reports_total") or 0.0


def reports_once_served(port: int) -> float:
    """`reports`, 0 while the coordinator does not serve its metrics yet (it starts them
    after it says it listens)."""
    try:
        return reports(port)
    except urllib.error.URLError:
        return 0.0


def reports_in(port: int, seconds: float) -> float:
    before = reports(port)
    time.sleep(seconds)
    return reports(port) - before


def test_a_large_jobs_node_holds_back_progress_alone_and_sends_a_stall(tmp_path: Path) -> None:
    beacons, metrics = tmp_path / "beacons", free_port()
    env = {**os.environ, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": str(4 * QUIET_WORLD)}
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(beacons)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        with coordinator(tmp_path, "--metrics-listen", f"127.0.0.1:{metrics}") as hub:
            agent = subprocess.Popen([*WATCHDOG, "agent", "--coordinator", hub.address,
                                      "--beacon-dir", str(beacons)], env=job_env(tmp_path),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                deadline = time.monotonic() + FIRST_REPORT_S
                while reports_once_served(metrics) < 2 and time.monotonic() < deadline:
                    time.sleep(0.2)
                progressing = reports_in(metrics, WINDOW_S)
                assert worker.stdin is not None
                worker.stdin.write("stall\n")
                worker.stdin.flush()
                time.sleep(1.0)  # the scan that finds no progress
                stalled = reports_in(metrics, WINDOW_S)
            finally:
                output = stop_process(agent)
        assert progressing >= 2, output  # held back once, never silent
        assert stalled >= 1.5 * progressing, (progressing, stalled, output)
    finally:
        worker.kill()
        worker.wait()
