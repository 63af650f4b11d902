"""Incident JSON (docs/design.md's contract), stack grouping, and the text `watchdog` prints."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Iterator

import pytest

from tests.helpers.builders import (
    BARRIER,
    DATA_STALL,
    DDP_BACKWARD,
    IDLE_WORKER,
    NCCL_LINE,
    SITE,
    STACKS,
    STUCK_WORKER,
    T0,
    TORCH_LINE,
    data_pipeline,
    done,
    entered,
    exited,
    incident,
    rank,
    snapshot,
    utc,  # noqa: F401 - the autouse fixture that pins local time to UTC applies here too
    with_children,
)
from watchdog.coordinator.incident import build_incident, rank_table, stack_groups
from watchdog.coordinator.verdict import decide
from watchdog.model import ExitReason, Frame, Kind, RankStack, Verdict
from watchdog.report.terminal import render_incident, render_incident_list, render_status, use_color
from watchdog.text import clock

INCIDENT_KEYS = [
    "id",
    "job_id",
    "detected_at",
    "kind",
    "severity",
    "summary",
    "culprit_ranks",
    "waiting_ranks",
    "collective",
    "advice",
    "attempt",
    "ranks",
    "rank_groups",
    "stack_groups",
]


def test_incident_has_design_keys_in_order_and_round_trips_as_json() -> None:
    record = incident()
    assert list(record) == INCIDENT_KEYS
    assert json.loads(json.dumps(record)) == record
    assert record["collective"] == {
        "group": "0",
        "ranks": [0, 1, 2, 3],
        "seq": 57,
        "op": "all_reduce",
    }
    assert (record["culprit_ranks"], record["waiting_ranks"]) == ([1], [0, 2, 3])


def test_rank_object_carries_state_progress_stack_and_log() -> None:
    rows = incident()["ranks"]
    assert isinstance(rows, list)
    assert [row["rank"] for row in rows] == [0, 1, 2, 3]
    (finding,) = rows[1].pop("nccl_findings")
    assert (finding["line_no"], finding["text"], finding["category"]) == (1, NCCL_LINE,
                                                                         "PEER_EXITED")
    assert finding["cause"] and finding["fix"]
    assert rows[0]["nccl_findings"] == []
    (finding,) = rows[1].pop("worker_findings")
    assert (finding["text"], finding["category"], finding["ranks"]) == (
        TORCH_LINE, "COLLECTIVE_TIMEOUT", [1])
    assert rows[0]["worker_findings"] == []
    assert rows[1] == {
        "rank": 1, "host": "node-a", "node": "node-a", "pid": 4243, "state": "STALLED", "step": 56,
        "last_collective": {"group": "0", "seq": 56, "op": "all_reduce", "completed": True},
        "setup": None,
        "stack": [{"function": f.function, "file": f.file, "line": f.line} for f in DATA_STALL],
        "children": [], "nccl_log": [NCCL_LINE], "worker_log": [TORCH_LINE], "exit_code": None,
        "exit_reason": None,
        "heartbeat_age": 0.2, "phase": "", "activity": None,
        "timeline": {"last_event_at": T0, "exited_at": None, "collectives": [
            {"group": "0", "seq": 56, "op": "all_reduce", "completed": True,
             "entered_at": T0 + 2.6}]},
    }  # fmt: skip
    assert rows[0]["state"] == "WAITING"
    assert rows[0]["last_collective"]["completed"] is False
    assert rows[0]["nccl_log"] == []


def test_a_rank_row_carries_the_children_it_waits_on() -> None:
    job = with_children(IDLE_WORKER, STUCK_WORKER)
    verdict = decide(job)
    assert verdict is not None
    row = build_incident(job, verdict, "9c1e04d2b7aa", T0 + 45.25)["ranks"][1]
    assert row["children"][1] == {
        "pid": 5001, "role": "dataloader_worker", "worker_id": 1, "state": "S",
        "stack": [{"function": f.function, "file": f.file, "line": f.line}
                  for f in STUCK_WORKER.frames],
        "error": "", "moved": False, "cpu": 0.0, "exit_code": None, "exit_reason": None,
    }  # fmt: skip
    assert row["children"][0]["worker_id"] == 0


def test_a_rank_whose_dataloader_worker_was_killed_carries_it_as_a_dead_child() -> None:
    killed = ExitReason("RuntimeError", "DataLoader worker (pid 4250) is killed by signal: "
                        "Killed. ", oom_killed=True)
    job = snapshot(dataclasses.replace(exited(rank(1, done(56, 2.6)), 3.0, 1, False),
                                       exit_reason=killed),
                   rank(0, entered(57, 3.1)), stalled=False)
    (row,) = [r for r in rank_table(job)["ranks"] if r["rank"] == 1]
    assert row["children"] == [{
        "pid": 4250, "role": "dataloader_worker", "worker_id": None, "state": "", "stack": [],
        "error": "", "moved": False, "cpu": 0.0, "exit_code": None,
        "exit_reason": {"signal": "SIGKILL", "oom_killed": True}}]


def test_node_key_only_for_unreachable_nodes() -> None:
    job = data_pipeline()
    lost = Verdict(Kind.NODE_UNREACHABLE, "node-b stopped reporting", (), (), node="node-b")
    assert list(build_incident(job, lost, "x", T0))[-1] == "node"
    assert build_incident(job, lost, "x", T0)["node"] == "node-b"
    missing = decide(job)
    assert missing is not None
    assert "node" not in build_incident(job, missing, "y", T0)


def test_rank_states() -> None:
    job = snapshot(
        rank(0, done(57, 3.0), proc_state="T"),
        rank(1, done(57, 3.0), proc_state="D"),
        rank(2, done(57, 3.0), heartbeat_age=25.0),
        rank(3, entered(58, 4.0)),
        exited(rank(4, done(57, 3.0)), at=5.0, code=None, clean=False),
        exited(rank(5, done(57, 3.0)), at=5.0, code=0, clean=True),
        exited(rank(6, done(57, 3.0)), at=5.0, code=0, clean=False),
        rank(7, done(57, 3.0)),
        rank(8, entered(57, 3.0)),  # rank 3 entered #58: this one is past #57, whatever it shows
    )
    states = [row["state"] for row in rank_table(job)["ranks"]]
    assert states == [
        "STOPPED",
        "WEDGED",
        "WEDGED",
        "WAITING",
        "EXITED",
        "FINISHED",
        "EXITED",
        "STALLED",
        "STALLED",
    ]
    healthy = snapshot(rank(0, done(57, 3.0)), stalled=False)
    assert rank_table(healthy)["ranks"][0]["state"] == "RUNNING"


def test_last_collective_is_the_one_entered_last_across_groups() -> None:
    pair = entered(5, 4.0, group="1", ranks=(0, 1))
    job = snapshot(rank(0, done(57, 3.0), pair), rank(1))
    rows = rank_table(job)["ranks"]
    assert rows[0]["last_collective"] == {
        "group": "1",
        "seq": 5,
        "op": "all_reduce",
        "completed": False,
    }
    assert rows[1]["last_collective"] is None


def test_stack_groups_ignore_library_lines_split_on_user_lines_minority_first() -> None:
    other_poll_line = (
        Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 831),
        *DDP_BACKWARD[1:],
    )
    other_call_site = (
        *DDP_BACKWARD[:3],
        Frame("main", "/home/ml/train.py", 119),
        *DDP_BACKWARD[4:],
    )
    stacks = {
        0: RankStack(0, 4242, DDP_BACKWARD),
        1: RankStack(1, 4243, DATA_STALL),
        2: RankStack(2, 4244, other_poll_line),
        3: RankStack(3, 4245, other_call_site),
        4: RankStack(4, 4246, DDP_BACKWARD),
        5: RankStack(5, 4247, error="Failed to get stack traces"),
    }
    assert stack_groups(stacks) == [
        {"ranks": [1], "top": "read_sample_from_storage (train.py:42)"},
        {"ranks": [3], "top": "_engine_run_backward (graph.py:829)"},
        {"ranks": [0, 2, 4], "top": "_engine_run_backward (graph.py:829)"},
    ]


def test_incident_text_has_table_verdict_stack_groups_and_culprit_stack() -> None:
    text = render_incident(incident(), color=False)
    header = text.splitlines()[3]
    assert header.startswith("RANK  ")
    for column in ("RANK", "HOST", "PID", "STATE", "STEP", "LAST COLLECTIVE", "HEARTBEAT"):
        assert column in header
    assert "all_reduce #57 g0 (pending)" in text
    assert "all_reduce #56 g0 (done)" in text
    assert "rank 1 (stuck in read_sample_from_storage at train.py:42) never reached" in text
    assert "ranks 0,2,3  _engine_run_backward (graph.py:829)" in text
    assert f"  {DATA_STALL[0].file}:42 read_sample_from_storage" in text
    assert f"  {DATA_STALL[-1].file}:130 <module>" in text
    assert NCCL_LINE in text
    assert TORCH_LINE in text and "COLLECTIVE_TIMEOUT: " in text
    assert "\x1b" not in text


def test_a_notice_that_ended_says_when_its_rank_moved_on() -> None:
    notice = {**incident(), "kind": "RANK_BUSY", "severity": "notice"}
    heading = render_incident(notice).splitlines()[0]
    assert heading.endswith("(notice: the job is not hung)")
    ended = render_incident({**notice, "ended_at": T0 + 75.0}).splitlines()[0]
    assert ended.endswith(f"(notice: the job is not hung; moved on at {clock(T0 + 75.0)})")


def test_table_columns_line_up() -> None:
    lines = render_incident(incident(), color=False).splitlines()
    table = lines[3:8]
    offset = table[0].index("STATE")
    assert [line[offset:].split()[0] for line in table] == [
        "STATE",
        "WAITING",
        "STALLED",
        "WAITING",
        "WAITING",
    ]


def test_color_only_when_asked() -> None:
    colored = render_incident(incident(), color=True)
    assert "\x1b[" in colored
    assert "\x1b[" not in render_incident(incident(), color=False)


@pytest.fixture
def terminal() -> Iterator[io.TextIOWrapper]:
    leader, follower = os.openpty()
    stream = open(follower, "w")  # noqa: SIM115 - closed below
    try:
        yield stream
    finally:
        stream.close()
        os.close(leader)


def test_use_color_needs_a_terminal_and_no_no_color(
    terminal: io.TextIOWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color(terminal)
    assert not use_color(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(terminal)


def test_status_text_lists_jobs_ranks_and_verdict() -> None:
    record = incident()
    job = data_pipeline(stacks=STACKS)
    status = {
        "jobs": [
            {
                "job_id": job.job_id,
                "state": "HUNG",
                "world_size": 4,
                "nodes": ["node-a"],
                **rank_table(job),
                "verdict": record,
            }
        ]
    }
    text = render_status(status)
    assert text.splitlines()[0] == "job torchrun-4f2a  HUNG  world size 4  nodes node-a"
    assert "*1" in text  # the culprit's row is marked
    assert f"MISSING_RANKS: {record['summary']}" in text
    assert render_status({"jobs": []}) == "no jobs"


def test_incident_list_a_header_and_one_line_each() -> None:
    record = incident()
    assert render_incident_list([]) == "no incidents"
    header, line, unnamed = render_incident_list([(record, "head:29450"),
                                                  (record, "")]).splitlines()
    assert header == ("ID            DETECTED             JOB            KIND           "
                      "COORDINATOR  SUMMARY")
    expected = ("9c1e04d2b7aa  2025-12-02 12:00:45  torchrun-4f2a  MISSING_RANKS  head:29450   "
                "rank 1 ")
    assert line.startswith(expected)
    assert unnamed.startswith(expected.replace("head:29450", "-         "))


def test_barrier_trap_renders_both_stacks_apart() -> None:
    job = snapshot(
        rank(0, entered(57, 3.0, op="barrier")),
        rank(1, entered(57, 3.1)),
        rank(2, entered(57, 3.2)),
        rank(3, entered(57, 3.3)),
        stacks={0: BARRIER, 1: DDP_BACKWARD, 2: DDP_BACKWARD, 3: DDP_BACKWARD},
    )
    verdict = decide(job)
    assert verdict is not None
    groups = build_incident(job, verdict, "z", T0)["stack_groups"]
    assert groups == [
        {"ranks": [0], "top": "barrier (distributed_c10d.py:4811)"},
        {"ranks": [1, 2, 3], "top": "_engine_run_backward (graph.py:829)"},
    ]


def test_timeline_keeps_each_groups_last_collective_the_latest_first_bounded() -> None:
    groups = [done(10 + g, float(g), group=str(g), ranks=(0,)) for g in range(12)]
    job = snapshot(exited(rank(0, *groups), at=20.0, code=1, clean=False))
    timeline = rank_table(job)["ranks"][0]["timeline"]
    assert timeline["last_event_at"] == T0
    assert timeline["exited_at"] == T0 + 20.0
    assert [c["group"] for c in timeline["collectives"]] == [str(g) for g in range(11, 3, -1)]
    assert timeline["collectives"][0] == {"group": "11", "seq": 21, "op": "all_reduce",
                                          "completed": True, "entered_at": T0 + 11.0}


def test_how_ranks_ended_and_the_advice_reach_the_incident_and_its_text() -> None:
    raised = ExitReason("ValueError", "environment variable MASTER_ADDR expected, but not set",
                        (Frame("_env_rendezvous_handler", f"{SITE}/torch/distributed/"
                               "rendezvous.py", 265), Frame("main", "/home/ml/train.py", 90)))
    job = snapshot(
        dataclasses.replace(exited(rank(1, done(56, 2.0)), 3.0, 1, False), exit_reason=raised),
        dataclasses.replace(exited(rank(2, done(56, 2.0)), 4.0, None, False),
                            exit_reason=ExitReason(signal="SIGKILL", oom_killed=True)),
        rank(0, entered(57, 3.1)), rank(3, entered(57, 3.2), setup="new_group"), stalled=False)
    verdict = decide(job)
    assert verdict is not None
    record = build_incident(job, verdict, "1", T0 + 5)
    rows = {row["rank"]: row for row in record["ranks"]}
    assert rows[1]["exit_reason"] == {"exception": {
        "type": "ValueError", "message": raised.message,
        "frames": [{"function": f.function, "file": f.file, "line": f.line}
                   for f in raised.frames]}}
    assert rows[2]["exit_reason"] == {"signal": "SIGKILL", "oom_killed": True}
    assert rows[0]["exit_reason"] is None and rows[3]["setup"] == "new_group"
    assert record["advice"]["category"] == "ENV_MISSING"
    text = render_incident(record)
    assert "EXITED (SIGKILL)" in text and "new_group (waiting)" in text
    assert "ENV_MISSING: environment variable MASTER_ADDR is not set" in text
    assert ("rank 1 raised ValueError: environment variable MASTER_ADDR expected, but not set\n"
            f"  {SITE}/torch/distributed/rendezvous.py:265 _env_rendezvous_handler\n"
            "  /home/ml/train.py:90 main") in text
