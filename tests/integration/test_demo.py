"""`watchdog demo`, the command on the README's first line: a real 4-rank job, diagnosed."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.helpers.harness import JOB_TIMEOUT_S, WATCHDOG, job_env


def test_demo_names_rank_2_and_keeps_the_jobs_noise_apart(tmp_path: Path) -> None:
    env = {**job_env(tmp_path), "TMPDIR": str(tmp_path)}
    db = tmp_path / "demo.db"
    demo = subprocess.run([*WATCHDOG, "demo", "--db", str(db)], env=env, capture_output=True,
                          text=True, timeout=JOB_TIMEOUT_S)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "MISSING_RANKS in job " in demo.stdout
    assert "rank 2 (stuck in read_sample_from_storage at train.py:" in demo.stdout
    assert "Traceback" not in demo.stdout + demo.stderr  # torchrun's, after the kill
    # The banner's step is the culprit's in the table: the steps it finished.
    banner = re.search(r"after (\d+) steps rank 2 blocks", demo.stdout)
    row = re.search(r"^\*2 +\S+ +\d+ +STALLED +(\d+) ", demo.stdout, re.MULTILINE)
    assert banner is not None and row is not None, demo.stdout
    assert banner[1] == row[1], demo.stdout
    log = re.search(r"The job's own output is in (\S+)\.", demo.stdout)
    assert log is not None, demo.stdout
    assert "Received 15 death signal" in Path(log[1]).read_text()  # torchrun, being ended
    listed = subprocess.run([*WATCHDOG, "incidents", "list", "--json", "--db", str(db)],
                            env=env, capture_output=True, text=True, check=True)
    (incident,) = json.loads(listed.stdout)
    assert (incident["kind"], incident["culprit_ranks"]) == ("MISSING_RANKS", [2])
