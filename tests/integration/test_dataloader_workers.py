"""A rank that waits for its DataLoader worker, under `watchdog run` at default settings: the
incident names the worker and carries its stack (real torchrun, gloo, DataLoader workers,
py-spy)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers.harness import (
    EXIT_HANG_KILLED,
    FLOOR_S,
    WATCHDOG,
    assert_called_at,
    assert_nothing_left,
    fault_time,
    job_env,
)

DEFAULTS = ("--on-hang", "kill")  # every threshold at its default; a hang ends the job


def test_a_blocked_dataloader_worker_is_named_with_its_stack(watch: Any, tmp_path: Path) -> None:
    run = watch("--fault", "worker_stall", "--fault-rank", "1", "--fault-step", "6",
                "--num-workers", "2", nproc=3, watchdog_args=DEFAULTS)
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert_nothing_left(tmp_path)  # the blocked worker too, which never sees its rank die
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "MISSING_RANKS"
    assert run.incident["culprit_ranks"] == [1]
    (worker,) = [c for c in run.rank(1)["children"] if c["worker_id"] == 1]
    assert worker["role"] == "dataloader_worker"
    assert worker["stack"][0]["function"] == "read_record", worker
    assert re.search(rf"rank 1 \(waits for its DataLoader worker 1 \(pid {worker['pid']}\), "
                     r"stuck in read_record at train\.py:\d+\) never reached",
                     run.incident["summary"]), run.incident["summary"]
    assert run.rank(0)["children"] == []  # a rank in its collective is not waiting on a child
    assert_called_at(FLOOR_S, run.incident["detected_at"], fault_time(run.output, "worker_stall"))
    page = tmp_path / "incident.html"
    shown = subprocess.run([*WATCHDOG, "incidents", "show", run.incident["id"], "--html",
                            str(page)], env=job_env(tmp_path), capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    html = page.read_text()
    assert f"its DataLoader worker 1 (pid {worker['pid']}" in html
    assert "read_record" in html
