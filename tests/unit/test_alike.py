"""A large job's incident and status: ranks alike as ranges with what they share, culprits and
ranks with evidence of their own in full, and every rank readable from one or the other."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tests.helpers.builders import DATA_STALL, DDP_BACKWARD, done, entered, rank, snapshot
from watchdog.coordinator.alike import ranges, rank_in
from watchdog.coordinator.incident import build_incident, rank_table
from watchdog.coordinator.verdict import decide
from watchdog.model import FULL_ROWS, JobSnapshot
from watchdog.report.incident_page import incident_html
from watchdog.report.job_pages import job_page, jobs_page
from watchdog.report.terminal import render_incident, render_status

SIZE = 4096
CULPRIT = 1111
LOGGED = 77  # its stack came with an NCCL warning: evidence of its own


def stalled_job(size: int) -> JobSnapshot:
    """Rank CULPRIT's data read never returns; every other rank waits in all_reduce #57."""
    world = tuple(range(size))
    ranks = [rank(r, done(56, 2.6, ranks=world) if r == CULPRIT else entered(57, 3.0,
                                                                             ranks=world),
                  world_size=size, local_rank=r % 8, host=f"node-{r // 8}") for r in range(size)]
    job = snapshot(*ranks, stacks={r: DATA_STALL if r == CULPRIT else DDP_BACKWARD
                                   for r in range(size)})
    stacks = dict(job.stacks)
    stacks[LOGGED] = dataclasses.replace(stacks[LOGGED], nccl_log=(
        "node-9:4319:4400 [5] misc/socket.cc:49 NCCL WARN socket closed",))
    return dataclasses.replace(job, stacks=stacks)


def incident_of(job: JobSnapshot) -> dict[str, object]:
    verdict = decide(job)
    assert verdict is not None
    return build_incident(job, verdict, "5eb1a1e0c0de", job.now)


def test_ranges_are_sorted_inclusive_runs() -> None:
    assert ranges([5, 0, 1, 2, 3, 9, 10]) == [[0, 3], [5, 5], [9, 10]]
    assert ranges([]) == []


def test_a_large_jobs_incident_lists_the_odd_ranks_in_full_and_the_rest_as_ranges() -> None:
    incident = incident_of(stalled_job(SIZE))
    assert incident["culprit_ranks"] == [CULPRIT]
    assert [row["rank"] for row in incident["ranks"]] == [LOGGED, CULPRIT]
    (waiting,) = incident["rank_groups"]
    assert waiting["ranks"] == [[0, LOGGED - 1], [LOGGED + 1, CULPRIT - 1], [CULPRIT + 1,
                                                                             SIZE - 1]]
    assert (waiting["count"], waiting["state"], waiting["step"], waiting["hosts"]) == (
        SIZE - 2, "WAITING", 56, SIZE // 8)
    assert waiting["last_collective"] == {"group": "0", "seq": 57, "op": "all_reduce",
                                          "completed": False}
    # "What was rank 3000 doing?": its group says, and a rank in full is its own row.
    asked = rank_in(incident, 3000)
    assert asked is not None and (asked["rank"], asked["state"]) == (3000, "WAITING")
    assert asked["stack"][0]["function"] == DDP_BACKWARD[0].function
    culprit = rank_in(incident, CULPRIT)
    assert culprit is not None and culprit["stack"][0]["function"] == DATA_STALL[0].function
    assert rank_in(incident, SIZE) is None
    text = json.dumps(incident)
    assert json.loads(text) == incident
    # A few rows' worth: the size follows the kinds of rank, not their number.
    assert len(text) < 100 * len(json.dumps(incident["ranks"][0]))
    assert "WAITING" in render_incident(incident)


def test_up_to_full_rows_every_rank_is_listed_in_full() -> None:
    incident = incident_of(stalled_job(FULL_ROWS))
    assert [row["rank"] for row in incident["ranks"]] == list(range(FULL_ROWS))
    assert incident["rank_groups"] == []


def test_the_page_of_a_large_incident_shows_its_groups_and_counts_every_rank() -> None:
    page = incident_html(incident_of(stalled_job(SIZE)))
    assert f"<b>{SIZE}</b> ranks" in page
    assert f"0-76,78-1110,1112-4095 ({SIZE - 2})" in page


def large_status(job: JobSnapshot) -> dict[str, Any]:
    nodes = sorted({state.host for state in job.ranks})
    return {"jobs": [{"job_id": "big", "state": "HUNG", "world_size": SIZE, "nodes": nodes,
                      **rank_table(job, [CULPRIT]), "verdict": None, "findings": [],
                      "flagged": []}]}


def test_a_large_jobs_status_is_a_line_per_group_and_counts_its_nodes() -> None:
    job = stalled_job(SIZE)
    nodes = sorted({state.host for state in job.ranks})
    status = large_status(job)
    header, titles, *rows = render_status(status).splitlines()
    assert titles.split()[:3] == ["RANK", "HOST", "PID"]
    assert header.endswith(f"nodes {SIZE // 8} ({nodes[0]} ... {nodes[-1]})")
    assert [row.split()[0] for row in rows] == [str(LOGGED), str(CULPRIT),
                                                "0-76,78-1110,1112-4095"]
    assert f"({SIZE - 2})  {SIZE // 8} hosts" in rows[-1] and "WAITING" in rows[-1]


def test_the_web_views_pages_of_a_large_job_count_its_nodes_and_every_rank() -> None:
    status = large_status(stalled_job(SIZE))
    nodes = status["jobs"][0]["nodes"]
    listing = jobs_page(status, [])
    every = ", ".join(nodes[:2])  # how the nodes were listed before: all of them
    assert f"{SIZE // 8} ({nodes[0]} ... {nodes[-1]})" in listing and every not in listing
    assert f"{SIZE - 1} WAITING" in listing  # the grouped ranks are counted too
    page = job_page(status["jobs"][0])
    assert f"{SIZE // 8} ({nodes[0]} ... {nodes[-1]})" in page and every not in page
