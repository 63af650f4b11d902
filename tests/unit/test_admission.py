"""Which reported ranks a job trusts: a forged world size or a second holder of a rank is
flagged, never judged; the real job wins its shape back from a forgery seen first."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.helpers.builders import JOB, T0, done, rank
from watchdog.coordinator import Coordinator, StallPolicy
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.model import NodeReport, RankState


def hub(tmp_path: Path) -> Coordinator:
    return Coordinator(SqliteStore(str(tmp_path / "incidents.db")), StallPolicy())


def world_of(size: int, *ranks: int, **changes: object) -> list[RankState]:
    return [rank(r, done(5, 1.0), world_size=size, **changes) for r in ranks]


def test_a_forged_huge_world_seen_first_gives_way_to_the_real_job(tmp_path: Path) -> None:
    coordinator = hub(tmp_path)
    forged = rank(0, world_size=1_000_000, pid=666)
    coordinator.ingest(NodeReport("node-x", T0, (forged,)), T0)
    assert coordinator.jobs[JOB].world_size == 1_000_000
    coordinator.ingest(NodeReport("node-a", T0 + 1, tuple(world_of(4, 0, 1))), T0 + 1)
    coordinator.ingest(NodeReport("node-b", T0 + 1, tuple(world_of(4, 2, 3))), T0 + 1)
    job = coordinator.jobs[JOB]
    assert (job.world_size, sorted(job.ranks), job.started) == (4, [0, 1, 2, 3], True)
    (flag,) = coordinator.admission.to_json(JOB)
    assert (flag["node"], flag["pid"], flag["world_size"]) == ("node-x", 666, 1_000_000)
    assert flag["reason"] == "claims world size 1000000; the job's is 4"


def test_once_started_the_jobs_shape_is_fixed(tmp_path: Path) -> None:
    coordinator = hub(tmp_path)
    coordinator.ingest(NodeReport("node-a", T0, tuple(world_of(2, 0, 1))), T0)
    many = tuple(world_of(8, *range(8), pid=999))
    coordinator.ingest(NodeReport("node-x", T0 + 1, many), T0 + 1)
    job = coordinator.jobs[JOB]
    assert (job.world_size, sorted(job.ranks)) == (2, [0, 1])
    assert len(coordinator.admission.to_json(JOB)) == 8
    assert coordinator.job_status(job, T0 + 1)["flagged"][0]["world_size"] == 8


def test_a_rank_held_by_a_live_process_on_another_node_is_not_taken(tmp_path: Path) -> None:
    coordinator = hub(tmp_path)
    real = world_of(2, 0, 1)
    coordinator.ingest(NodeReport("node-a", T0, tuple(real)), T0)
    coordinator.ingest(NodeReport("node-x", T0 + 1, (dataclasses.replace(real[1], pid=666),)),
                       T0 + 1)
    job = coordinator.jobs[JOB]
    assert job.ranks[1].pid == real[1].pid and job.nodes[1] == "node-a"
    (flag,) = coordinator.admission.to_json(JOB)
    assert flag["reason"] == f"rank 1 is already pid {real[1].pid} on node node-a"
    # On its own node, a second live process of rank 1 is let in, as a duplicate the verdict
    # names (a restarted attempt is a job of its own); an exited holder makes room.
    coordinator.ingest(NodeReport("node-a", T0 + 2, (dataclasses.replace(real[1], pid=7),)),
                       T0 + 2)
    assert job.ranks[1].pid == real[1].pid and job.duplicates == {1: {(real[1].host, 7)}}
    gone = dataclasses.replace(real[1], exited_at=T0 + 2, proc_state="")
    coordinator.ingest(NodeReport("node-a", T0 + 3, (gone,)), T0 + 3)
    coordinator.ingest(NodeReport("node-b", T0 + 4, (dataclasses.replace(real[1], pid=8),)),
                       T0 + 4)
    assert (job.ranks[1].pid, job.nodes[1]) == (8, "node-b")


def test_flags_are_bounded_and_forgotten(tmp_path: Path) -> None:
    coordinator = hub(tmp_path)
    coordinator.ingest(NodeReport("node-a", T0, tuple(world_of(2, 0, 1))), T0)
    for n in range(200):
        coordinator.ingest(NodeReport("node-x", T0, (rank(0, world_size=3 + n, pid=n),)), T0)
    assert len(coordinator.admission.to_json(JOB)) == 64
    coordinator.ingest(NodeReport("node-x", T0 + 100, (rank(0, world_size=9, pid=1),)), T0 + 100)
    coordinator.admission.reconsider(coordinator.jobs[JOB], T0 + 100)
    assert len(coordinator.admission.to_json(JOB)) == 1
