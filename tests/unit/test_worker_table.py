"""The agent's worker table in this process: a beacon caught while its writer creates it is
read at the next scan, not ignored for good; one never written is given up after a while."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent.workers import NOT_READY_S, WorkerTable
from watchdog.beacon import BeaconWriter, Identity, beacon_path


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
