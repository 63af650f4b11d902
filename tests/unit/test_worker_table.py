"""The agent's worker table in this process: what a report carries of a rank's checks."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent.rankstate import rank_state
from agent.table import WorkerTable
from agent.worker import FINGERPRINT_REPORTS
from watchdog.beacon import BeaconWriter, CheckState, Fingerprint, Identity, beacon_path


def test_a_ranks_fingerprints_go_out_in_the_few_reports_after_it_took_one(
        tmp_path: Path) -> None:
    own = tmp_path / str(os.geteuid())  # the agent reads only users' own subdirectories
    own.mkdir(mode=0o755)
    path = beacon_path(str(own), "job", 0, os.getpid())
    writer = BeaconWriter(path, Identity("job", 0, 0, 2, "host", os.getpid(), time.time() - 1))
    table = WorkerTable(str(tmp_path), scan_unhooked=False)

    def reports(taken: int, n: int) -> list[int]:
        prints = tuple(Fingerprint("parameters", "0", 0, 8 * k, k) for k in range(1, taken + 1))
        writer.publish(8 * taken, [], {}, time.time(),
                       checks=CheckState(("replica_desync",), taken, prints))
        carried = []
        for _ in range(n):
            table.refresh(time.time())
            (worker,) = table.workers()
            state = rank_state(worker, time.time())
            assert state.evidence.checks == ("replica_desync",)
            carried.append(len(state.evidence.fingerprints))
        return carried

    assert reports(1, FINGERPRINT_REPORTS + 2) == [1] * FINGERPRINT_REPORTS + [0, 0]
    assert reports(2, 1) == [2]
