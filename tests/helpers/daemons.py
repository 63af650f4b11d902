"""Agent and coordinator as separate processes on loopback, and a demo job with rank 2 stuck in
its data pipeline, known by its WATCHDOG_JOB_ID (the agent sees every torchrun job on the
machine); `watchdog status` reads the coordinator."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers.harness import WATCHDOG, job_env, stop_process, stored
from watchdog.cli.demo import free_port, torchrun_command

D = TypeVar("D", bound="Daemons")
DIAGNOSIS_DEADLINE_S = 120
JOB_ID = "daemons-test-job"
# A job whose ranks take 3 steps together, then sleep: a stall with no culprit of its own.
HANG_AFTER_3_STEPS = ("import time, torch, torch.distributed as dist, watchdog\n"
                      "dist.init_process_group('gloo')\n"
                      "for _ in range(3):\n"
                      "    dist.all_reduce(torch.ones(1)); watchdog.step()\n"
                      "time.sleep(600)\n")


class Daemons:
    """One coordinator and one agent, each of which a test may kill and restart."""

    def __init__(self, tmp_path: Path) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.env = job_env(tmp_path)
        self.logs: list[str] = []
        self.coordinator = self.start_coordinator()
        self.agent = self._spawn("agent", "--coordinator", self.address, "--interval", "0.25",
                                 "--node-name", "node-a")

    def _spawn(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*WATCHDOG, *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def start_coordinator(self) -> subprocess.Popen[str]:
        return self._spawn("coordinator", "--listen", self.address, "--stall-timeout", "3")

    def kill_coordinator(self) -> None:
        self.coordinator.kill()  # SIGKILL: no chance to clean up
        self.logs.append(self.coordinator.communicate()[0])

    def stop(self) -> None:
        self.logs += [stop_process(proc) for proc in (self.agent, self.coordinator)]


@contextlib.contextmanager
def running(kind: type[D], tmp_path: Path) -> Iterator[D]:
    """The daemons of `kind`, stopped afterwards; their logs printed (pytest shows them when the
    test fails)."""
    daemons = kind(tmp_path)
    try:
        yield daemons
    finally:
        daemons.stop()
        print("\n---\n".join(daemons.logs))


def status(address: str) -> dict[str, Any] | None:
    """`watchdog status --json`, or None while the coordinator is not up yet."""
    out = subprocess.run([*WATCHDOG, "status", "--json", "--coordinator", address],
                         capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout) if out.returncode == 0 else None


def wait_for_verdict(address: str, job_id: str = JOB_ID) -> dict[str, Any]:
    """The view of this test's job once it has a verdict (the agent sees every torchrun job on
    the machine; this one is known by its WATCHDOG_JOB_ID)."""
    return until_verdict(lambda: status(address), job_id)


def until_verdict(read: Callable[[], dict[str, Any] | None], job_id: str) -> dict[str, Any]:
    """The view of `job_id` in what `read` returns (`watchdog status --json`, or None while
    the coordinator is not up) once it has a verdict."""
    deadline = time.monotonic() + DIAGNOSIS_DEADLINE_S
    while time.monotonic() < deadline:
        ours = [job for job in (read() or {"jobs": []})["jobs"] if job["job_id"] == job_id]
        if ours and ours[0]["verdict"] is not None:
            view: dict[str, Any] = ours[0]
            return view
        time.sleep(1)
    raise AssertionError(f"no verdict within {DIAGNOSIS_DEADLINE_S}s: {read()}")


def start_job(tmp_path: Path, *prefix: str, job_id: str = JOB_ID,
              nproc: int = 4) -> subprocess.Popen[str]:
    """The demo job with rank 2 stuck in its data pipeline; `prefix` may inject the hook."""
    cmd = [*prefix, *torchrun_command(nproc, "--fault", "data_stall", "--fault-rank", "2",
                                      "--fault-step", "4")]
    return subprocess.Popen(cmd, env={**job_env(tmp_path), "WATCHDOG_JOB_ID": job_id},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def end_job(job: subprocess.Popen[str]) -> None:
    job.send_signal(signal.SIGTERM)
    job.communicate(timeout=60)


def job_incidents(tmp_path: Path) -> list[dict[str, Any]]:
    """The stored incidents of this test's job (the agent sees other tests' jobs too)."""
    return [incident for incident in stored(tmp_path) if incident["job_id"] == JOB_ID]


class WebDaemons(Daemons):
    """`Daemons`, the coordinator with its web view on."""

    def __init__(self, tmp_path: Path) -> None:
        self.web = f"127.0.0.1:{free_port()}"
        super().__init__(tmp_path)

    def start_coordinator(self) -> subprocess.Popen[str]:
        return self._spawn("coordinator", "--listen", self.address, "--stall-timeout", "3",
                           "--web-listen", self.web)
