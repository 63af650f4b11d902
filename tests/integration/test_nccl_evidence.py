"""The incident carries the culprit's NCCL WARN line, classified: from its NCCL_DEBUG_FILE, or
from the file torchrun --tee sends its output to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def test_incident_carries_the_culprits_nccl_warn_line(watch: Any, tmp_path: Path,
                                                       monkeypatch: Any) -> None:
    nccl_dir = tmp_path / "nccl"
    nccl_dir.mkdir()
    monkeypatch.setenv("NCCL_DEBUG_FILE", f"{nccl_dir}/nccl.%h.%p.log")
    run = watch("--fault", "nccl_peer_closed", "--fault-rank", "2", "--fault-step", "3", nproc=3)
    assert run.incident is not None, run.output
    assert run.incident["culprit_ranks"] == [2]
    culprit = run.rank(2)
    warn = [line for line in culprit["nccl_log"] if "NCCL WARN" in line]
    assert len(warn) == 1 and "Connection closed by remote peer" in warn[0]
    assert warn[0].startswith(f"{os.uname().nodename.split('.')[0]}:{culprit['pid']}:")
    (finding,) = culprit["nccl_findings"]
    assert finding["category"] == "PEER_EXITED"
    assert finding["text"] == warn[0]
    # The other ranks logged only INFO lines: nothing relevant to show for them.
    assert all(run.rank(r)["nccl_log"] == [] for r in (0, 1))
    assert len(list(nccl_dir.iterdir())) == 3


def test_incident_carries_the_culprits_output_that_torchrun_tee_kept(
        watch: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """Without NCCL_DEBUG_FILE, NCCL writes to stdout; torchrun --log-dir --tee puts each rank's
    output in a file of its own, which the agent reads through the rank's /proc fd links."""
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    logs = tmp_path / "torchrun-logs"
    run = watch("--fault", "nccl_peer_closed", "--fault-rank", "1", "--fault-step", "3",
                nproc=3, launcher=("--log-dir", str(logs), "--tee", "3"))
    assert run.incident is not None, run.output
    assert run.incident["culprit_ranks"] == [1]
    culprit = run.rank(1)
    assert culprit["nccl_log"] == []
    warn = [line for line in culprit["worker_log"] if "NCCL WARN" in line]
    assert len(warn) == 1 and "Connection closed by remote peer" in warn[0]
    assert warn[0].startswith(f"{os.uname().nodename.split('.')[0]}:{culprit['pid']}:")
    assert "PEER_EXITED" in [finding["category"] for finding in culprit["worker_findings"]]
    for rank in (0, 2):
        assert not any("NCCL WARN" in line for line in run.rank(rank)["worker_log"])
    assert len(list(logs.rglob("stdout.log"))) == 3
