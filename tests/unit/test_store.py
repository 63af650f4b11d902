"""Incident history: stored text comes back byte for byte; retention by count and by age."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from watchdog.coordinator.store import IncidentStore, incident_json

DAY = 86400.0


def incident(n: int, at: float) -> dict[str, Any]:
    return {"id": f"i{n}", "job_id": "job", "detected_at": at, "kind": "MISSING_RANKS",
            "summary": f"rank {n} never reached all_reduce #57 on group 0 (world) — ünïcode",
            "culprit_ranks": [n], "waiting_ranks": [], "collective": None, "ranks": [],
            "stack_groups": []}


def test_text_survives_reopening_byte_for_byte(tmp_path: Path) -> None:
    path = str(tmp_path / "db" / "incidents.db")
    store = IncidentStore(path)
    store.add(incident(1, 1000.0))
    before = store.get_json("i1")
    store.close()
    reopened = IncidentStore(path)
    assert reopened.get_json("i1") == before == incident_json(incident(1, 1000.0))
    assert json.loads(reopened.list_json()[0]) == incident(1, 1000.0)


def test_adding_the_same_incident_twice_keeps_one(tmp_path: Path) -> None:
    store = IncidentStore(str(tmp_path / "i.db"))
    store.add(incident(1, 1000.0))
    store.add(incident(1, 1000.0))
    assert len(store.list_json()) == 1


def test_adding_an_id_again_stores_its_newer_text_in_place(tmp_path: Path) -> None:
    store = IncidentStore(str(tmp_path / "i.db"))
    store.add(incident(1, 1000.0))
    store.add(incident(2, 1001.0))
    ended = {**incident(1, 1000.0), "ended_at": 1041.5}
    store.add(ended)
    assert store.get_json("i1") == incident_json(ended)
    assert [json.loads(t)["id"] for t in store.list_json()] == ["i2", "i1"]


def test_list_is_newest_first_and_retention_keeps_the_newest(tmp_path: Path) -> None:
    store = IncidentStore(str(tmp_path / "i.db"), keep_count=3, keep_days=30)
    for n in range(5):
        store.add(incident(n, 1000.0 + n))
    assert [json.loads(t)["id"] for t in store.list_json()] == ["i4", "i3", "i2"]


def test_retention_by_age(tmp_path: Path) -> None:
    store = IncidentStore(str(tmp_path / "i.db"), keep_count=100, keep_days=7)
    store.add(incident(1, 10 * DAY))
    store.add(incident(2, 16 * DAY))
    store.add(incident(3, 18 * DAY))  # i1 is now 8 days old
    assert [json.loads(t)["id"] for t in store.list_json()] == ["i3", "i2"]
    assert store.get_json("i1") is None


def big(n: int, at: float, size: int) -> dict[str, Any]:
    return {**incident(n, at), "log": "x" * size}


def test_retention_by_bytes_drops_the_oldest_first(tmp_path: Path) -> None:
    store = IncidentStore(str(tmp_path / "i.db"), keep_bytes=1 << 20)
    for n in range(64):  # 4 MiB in all
        store.add(big(n, 1000.0 + n, 64 << 10))
        assert store.used_bytes() <= 1 << 20
    kept = [json.loads(t)["id"] for t in store.list_json()]
    assert 8 <= len(kept) < 16  # 16 of 64 KiB would fill 1 MiB alone
    assert kept == [f"i{n}" for n in range(63, 63 - len(kept), -1)]


def test_retention_by_bytes_never_drops_the_newest(tmp_path: Path) -> None:
    store = IncidentStore(str(tmp_path / "i.db"), keep_bytes=1 << 20)
    store.add(big(1, 1000.0, 64 << 10))
    store.add(big(2, 1001.0, 2 << 20))  # over the limit on its own
    assert [json.loads(t)["id"] for t in store.list_json()] == ["i2"]
    store.add(big(3, 1002.0, 64 << 10))
    assert [json.loads(t)["id"] for t in store.list_json()] == ["i3"]
    assert store.used_bytes() <= 1 << 20
