"""The agent's worker table in this process: a beacon caught while its writer creates it is
read at the next scan, not ignored for good; one never written is given up after a while."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent.workers import FINGERPRINT_REPORTS, NOT_READY_S, WorkerTable, rank_state
from watchdog.beacon import BeaconWriter, CheckState, Fingerprint, Identity, beacon_path


def test_a_beacon_still_being_created_is_read_at_the_next_scan(tmp_path: Path) -> None:
    path = Path(beacon_path(str(tmp_path), "job", 0, os.getpid()))
    path.write_bytes(b"")  # created, not yet sized: what a scan can catch
    table = WorkerTable(str(tmp_path), scan_unhooked=False)
    table.refresh(time.time())
    assert table.workers() == []
    path.write_bytes(bytes(4096))  # sized, header not yet written
    table.refresh(time.time())
    assert table.workers() == []
    BeaconWriter(str(path), Identity("job", 0, 0, 1, "host", os.getpid(), time.time() - 1))
    table.refresh(time.time())
    assert [w.identity.rank for w in table.workers()] == [0]


def test_a_beacon_never_written_is_given_up(tmp_path: Path) -> None:
    path = Path(beacon_path(str(tmp_path), "job", 0, os.getpid()))
    path.write_bytes(b"")
    table = WorkerTable(str(tmp_path), scan_unhooked=False)
    table.refresh(time.time() + NOT_READY_S + 1)
    BeaconWriter(str(path), Identity("job", 0, 0, 1, "host", os.getpid(), time.time() - 1))
    table.refresh(time.time() + NOT_READY_S + 2)
    assert table.workers() == []


def test_a_ranks_fingerprints_go_out_in_the_few_reports_after_it_took_one(
        tmp_path: Path) -> None:
    path = beacon_path(str(tmp_path), "job", 0, os.getpid())
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
