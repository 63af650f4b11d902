"""Prometheus metrics of `watchdog run --metrics-listen`, scraped and parsed with
prometheus-client's own parser before and after a real torchrun job hangs."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.samples import Sample

from tests.helpers.harness import WATCHDOG, fault_time, job_env, stored
from tests.helpers.scrape import scrape, value
from watchdog.cli.demo import free_port, torchrun_command

PREFIX = "torch_hang_watchdog_"
DEADLINE_S = 120


def scrape_until(port: int, proc: subprocess.Popen[str],
                 ready: Callable[[list[Sample]], bool]) -> list[Sample]:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "watchdog run ended"
        try:
            samples = scrape(port)
        except OSError:
            samples = []  # not listening yet
        if samples and ready(samples):
            return samples
        time.sleep(0.25)
    raise AssertionError(f"metrics never got there: {scrape(port)}")


def stop_run(proc: subprocess.Popen[str]) -> str:
    """SIGTERM goes to the job; a second one kills it if it lingers."""
    for _ in range(2):
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    return proc.communicate()[0]


def jobs(samples: list[Sample], state: str) -> float | None:
    return value(samples, PREFIX + "jobs", state=state)


def test_metrics_follow_a_real_hang(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*WATCHDOG, "run", "--stall-timeout", "3", "--metrics-listen", f"127.0.0.1:{port}",
         "--", *torchrun_command(4, "--fault", "data_stall", "--fault-rank", "2",
                                 "--fault-step", "4")],
        env=job_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        before = scrape_until(port, proc, lambda s: jobs(s, "RUNNING") == 1
                              and value(s, PREFIX + "ranks") == 4)
        after = scrape_until(port, proc, lambda s: jobs(s, "HUNG") == 1)
    finally:
        output = stop_run(proc)
    print(output)
    assert all(s.name.startswith(PREFIX) for s in before + after)
    assert "watchdog: metrics at http://127.0.0.1:" in output
    incidents = {"kind": "MISSING_RANKS", "severity": "hang"}
    assert value(before, PREFIX + "incidents_total", **incidents) is None
    assert value(after, PREFIX + "incidents_total", **incidents) == 1
    assert (jobs(before, "HUNG"), jobs(after, "RUNNING")) == (0, 0)
    assert value(after, PREFIX + "ranks") == value(after, PREFIX + "agent_ranks") == 4
    assert (value(before, PREFIX + "verdict_latency_seconds_count"),
            value(after, PREFIX + "verdict_latency_seconds_count")) == (0, 1)
    # On a loaded machine a slow step before the fault can be a stall too, looked at with
    # stacks and found to move on: more than one of each, never none.
    for name in ("stalls_total", "stack_dump_seconds_count"):
        assert value(before, PREFIX + name) == 0, name
        assert (value(after, PREFIX + name) or 0) >= 1, name
    assert value(after, PREFIX + "stack_dump_failures_total") == 0
    reports_before = value(before, PREFIX + "reports_total")
    assert reports_before is not None and reports_before > 0
    assert (value(after, PREFIX + "reports_total") or 0) > reports_before
    assert (value(after, PREFIX + "agents_connected"), value(after, PREFIX + "reconnects_total")
            ) == (1, 0)


def test_a_hang_verdict_the_job_contradicts_is_marked_resumed_and_counted(
        tmp_path: Path) -> None:
    """Default settings, `--on-hang report`: rank 1's read takes 25 s at step 4, once. It is
    named a hang once the floor passed; then the read returns and the job trains on to its end.
    The verdict was wrong: the incident says when the job moved on, the false-alarm counter
    moved, `run` said so, and `incidents list` shows it."""
    port = free_port()
    proc = subprocess.Popen(
        [*WATCHDOG, "run", "--metrics-listen", f"127.0.0.1:{port}", "--",
         *torchrun_command(4, "--fault", "slow_read", "--fault-rank", "1", "--fault-step", "4",
                           "--fault-seconds", "25", "--steps", "30")],
        env=job_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        hung = scrape_until(port, proc, lambda s: jobs(s, "HUNG") == 1)
        moved = scrape_until(port, proc, lambda s: jobs(s, "RUNNING") == 1)
        output = proc.communicate(timeout=DEADLINE_S)[0]
    finally:
        if proc.poll() is None:
            output = stop_run(proc)
    assert value(hung, PREFIX + "verdicts_resumed_total") == 0
    assert value(moved, PREFIX + "verdicts_resumed_total") == 1
    assert proc.returncode == 0, output
    (hang,) = stored(tmp_path)
    assert (hang["kind"], hang["culprit_ranks"], hang["severity"]) == ("MISSING_RANKS", [1],
                                                                      "hang")
    began = fault_time(output, "slow_read")
    assert hang["detected_at"] < hang["resumed_at"]
    assert began + 25.0 - 1.0 <= hang["resumed_at"] <= began + 25.0 + 5.0
    assert re.search(rf"^watchdog: the job moved on \d+ s after hang incident {hang['id']} "
                     r"\(MISSING_RANKS\), with nobody acting on it: it was not hung after all",
                     output, re.MULTILINE), output
    assert "1 incident (1 hang, 1 of them contradicted by the job)" in output
    listed = subprocess.run([*WATCHDOG, "incidents", "list"], env=job_env(tmp_path),
                            capture_output=True, text=True, check=True).stdout
    assert re.search(rf"{hang['id']} .* MISSING_RANKS \(resumed after \d+ s\)", listed), listed
