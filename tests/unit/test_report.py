"""The HTML report's pure parts: the merged stack tree, rank grouping, the timeline, escaping,
and incidents that lack fields or carry newer ones."""

from __future__ import annotations

import html
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from agent import Agent
from tests.helpers.builders import (
    DATA_STALL,
    DDP_BACKWARD,
    IDLE_WORKER,
    SITE,
    STUCK_WORKER,
    T0,
    incident,
    with_children,
)
from watchdog.coordinator import Coordinator
from watchdog.coordinator.incident import build_incident
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.verdict import decide
from watchdog.model import Frame
from watchdog.report import incident_html, job_page, jobs_page
from watchdog.report.groups import group_ranks
from watchdog.report.stack_tree import merge_stacks, render_tree
from watchdog.report.timeline import lanes_of, render_timeline
from watchdog.supervise.embedded import RunOptions, _Run

HOSTILE = "<script>alert(1)</script>\x1b[31m"
SHOWN = html.escape("<script>alert(1)</script>\\x1b[31m")  # as text, the escape made visible


class Elements(HTMLParser):
    """The start tags of a page and the text inside elements of one class."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def with_class(self, name: str) -> list[dict[str, str]]:
        return [attrs for _, attrs in self.tags if name in attrs.get("class", "").split()]


def test_tree_shares_the_trunk_then_splits_with_the_culprits_side_first() -> None:
    stacks = {0: DDP_BACKWARD, 1: DATA_STALL, 2: DDP_BACKWARD, 3: DDP_BACKWARD}
    root = merge_stacks(stacks)
    (trunk,) = root.children.values()  # every stack starts in <module>
    assert trunk.frame is not None and trunk.frame.function == "<module>"
    assert trunk.ranks == [0, 1, 2, 3]
    assert sorted(len(c.ranks) for c in trunk.children.values()) == [1, 3]  # main: 2 call sites

    page = render_tree(stacks, culprits={1})
    branches = Elements(page).with_class("branch")
    assert [b["data-ranks"] for b in branches] == ["rank 1", "ranks 0,2,3"]
    assert "culprit" in branches[0]["class"]
    assert page.index("&lt;module&gt;") < page.index('class="split"')
    culprit_side = page[page.index('data-ranks="rank 1"'):page.index('data-ranks="ranks 0,2,3"')]
    assert "read_sample_from_storage" in culprit_side and "_engine_run_backward" not in culprit_side


def test_culprits_side_comes_first_even_when_it_is_the_larger_one() -> None:
    stacks = {0: DATA_STALL, 1: DATA_STALL, 2: DDP_BACKWARD}
    branches = Elements(render_tree(stacks, culprits={0, 1})).with_class("branch")
    assert [b["data-ranks"] for b in branches] == ["ranks 0,1", "rank 2"]


def test_library_lines_do_not_split_the_tree_but_user_lines_do() -> None:
    other_line = (Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 831),
                  *DDP_BACKWARD[1:])
    page = render_tree({0: DDP_BACKWARD, 1: other_line}, culprits=())
    assert 'class="split"' not in page
    assert "graph.py, lines 829, 831" in page


def test_ranks_that_behave_alike_share_a_row_even_by_thousands() -> None:
    record = incident()
    template = record["ranks"]
    rows = [dict(template[1 if rank == 2049 else 0], rank=rank, host=f"node-{rank // 8:04d}")
            for rank in range(4096)]
    groups = group_ranks(rows, culprits={2049})
    assert [(g.culprit, g.label) for g in groups] == [
        (True, "rank 2049"), (False, "ranks 0-2048,2050-4095")]
    assert groups[1].hosts() == "512 hosts (node-0000 … node-0511)"


def test_grouping_coarsens_until_it_fits() -> None:
    rows = [dict(incident()["ranks"][0], rank=rank, step=rank) for rank in range(100)]
    assert len(group_ranks(rows, culprits=(), limit=100)) == 100  # every step differs
    (group,) = group_ranks(rows, culprits=(), limit=10)  # steps no longer split them
    assert group.steps_vary and len(group.rows) == 100


def test_timeline_lists_the_culprit_lane_first_with_its_collectives() -> None:
    record = incident()
    groups = group_ranks(record["ranks"], culprits={1})
    lanes = lanes_of(groups)
    assert [lane.group.label for lane in lanes] == ["rank 1", "ranks 0,2,3"]
    assert [(c.op, c.seq, c.completed) for c in lanes[0].collectives] == [
        ("all_reduce", 56, True)]
    assert [(c.op, c.seq, c.completed) for c in lanes[1].collectives] == [
        ("all_reduce", 57, False)]
    svg = render_timeline(lanes, record["detected_at"])
    lane_tags = [attrs for tag, attrs in Elements(svg).tags if tag == "g"]
    assert [(t["class"], t["data-ranks"]) for t in lane_tags] == [
        ("lane culprit", "rank 1"), ("lane", "ranks 0,2,3")]
    assert "STALLED after all_reduce #56 (g0) · step 56" in svg
    assert "WAITING in all_reduce #57 (g0) · step 56" in svg


def hostile_incident() -> dict[str, Any]:
    """Every string a worker or agent can set, set to markup."""
    record = incident()
    record["job_id"] = record["summary"] = HOSTILE
    for row in record["ranks"]:
        row["host"] = row["node"] = row["phase"] = HOSTILE
        row["stack"] = [{"function": HOSTILE, "file": f"/x/{HOSTILE}.py", "line": 1}]
        row["nccl_log"] = row["worker_log"] = [HOSTILE]
        row["last_collective"] = {"group": HOSTILE, "seq": 1, "op": HOSTILE, "completed": False}
        row["nccl_findings"] = [{"category": HOSTILE, "cause": HOSTILE, "fix": HOSTILE,
                                 "text": HOSTILE, "line_no": 1, "ranks": [0]}]
        row["exit_reason"] = {"exception": {"type": HOSTILE, "message": HOSTILE}}
        row["activity"] = {HOSTILE: HOSTILE}
        row["children"] = [{"pid": HOSTILE, "role": "dataloader_worker", "worker_id": HOSTILE,
                            "state": HOSTILE, "cpu": HOSTILE, "stack": row["stack"]},
                           {"pid": 7, "role": HOSTILE, "error": HOSTILE, "stack": HOSTILE}]
        row["timeline"]["collectives"][0].update(group=HOSTILE, op=HOSTILE)
    return record


def test_every_worker_string_is_escaped_on_every_page() -> None:
    record = hostile_incident()
    job = {"job_id": HOSTILE, "state": "HUNG", "world_size": 4, "nodes": [HOSTILE],
           "ranks": record["ranks"], "verdict": record}
    for page in (incident_html(record), job_page(job),
                 jobs_page({"jobs": [job]}, [(record, HOSTILE)])):
        assert "<script" not in page.lower()
        assert SHOWN in page
        assert "\x1b" not in page
        assert all(tag != "script" for tag, _ in Elements(page).tags)


def test_the_stuck_dataloader_worker_is_shown_under_its_rank() -> None:
    job = with_children(IDLE_WORKER, STUCK_WORKER)
    verdict = decide(job)
    assert verdict is not None
    page = incident_html(build_incident(job, verdict, "9c1e04d2b7aa", T0 + 45.25))
    culprit = page[page.index("Culprit: rank 1"):]
    title = "its DataLoader worker 1 (pid 5001, state S, 0% of a core): stack, innermost first"
    assert title in culprit
    assert culprit.index(title) < culprit.index("read_shard") < culprit.index("data.py:16")


def test_the_page_fetches_nothing_and_runs_nothing() -> None:
    page = incident_html(incident())
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)


def test_missing_and_newer_fields_render() -> None:
    bare = {"id": "x", "kind": "RANK_STALLED", "summary": "ranks 0,1 made no progress"}
    assert "ranks 0,1 made no progress" in incident_html(bare)
    newer = incident()
    newer["severity"] = "notice"
    newer["kind"] = "RANK_BUSY"
    newer["ranks"][1] = dict(newer["ranks"][1], state="BUSY",
                             activity={"cpu_s_per_s": 0.97, "io_write_bytes_per_s": 4.0e7})
    for row in newer["ranks"]:
        del row["timeline"]  # incidents stored before the timeline was recorded
    page = incident_html(newer)
    assert 'class="verdict notice"' in page
    assert "io_write_bytes_per_s" in page and "40000000.0" in page
    assert "BUSY" in page


def test_activity_is_shown_with_units() -> None:
    record = incident()
    record["ranks"][1]["activity"] = {"window": 3.02, "main_cpu": 0.0, "process_cpu": 1.5,
                                      "read_rate": 0, "write_rate": 41.9e6, "gpu_util": None}
    page = incident_html(record)
    for shown in ("measured over</td><td class=\"mono\">3.0 s", "main thread CPU</td><td "
                  "class=\"mono\">0% of a core", "150% of a core", "0 B/s", "41.9 MB/s",
                  "GPU busy</td><td class=\"mono\">not measured"):
        assert shown in page
    assert "main_cpu" not in page and "null" not in page


def test_exited_rank_shows_its_exit_on_the_timeline() -> None:
    record = incident()
    row = record["ranks"][1]
    row.update(state="EXITED", exit_code=3)
    row["timeline"]["exited_at"] = record["detected_at"] - 5
    groups = group_ranks(record["ranks"], culprits={1})
    (exited,) = [lane for lane in lanes_of(groups) if lane.group.culprit]
    assert exited.exited is not None
    assert "exited at" in render_timeline(lanes_of(groups), record["detected_at"])
    assert "EXITED</span> <span class=\"muted\">(3)" in incident_html(record)


def test_job_page_grid_has_one_cell_per_rank_culprit_outlined() -> None:
    record = incident()
    live = [dict(row, stack=[]) for row in record["ranks"]]  # status rows carry no stacks
    job = {"job_id": "j", "state": "HUNG", "world_size": 4, "nodes": ["node-a"],
           "ranks": live, "verdict": record}
    page = job_page(job)
    assert "read_sample_from_storage (train.py:42)" in page  # from the verdict's stacks
    cells = Elements(page).with_class("cell")
    assert [c["data-rank"] for c in cells] == ["0", "1", "2", "3"]
    assert [c["data-rank"] for c in cells if "culprit" in c["class"]] == ["1"]
    assert {c["data-state"] for c in cells} == {"WAITING", "STALLED"}


def test_run_writes_the_first_hang_page_and_never_waits_on_it(tmp_path: Path) -> None:
    page = tmp_path / "hang.html"
    out = io.StringIO()
    agent = Agent(None, str(tmp_path), "node")
    hub = Coordinator(SqliteStore(str(tmp_path / "incidents.db")), StallPolicy())
    run = _Run(RunOptions(["job"], StallPolicy(), on_hang="kill", report_html=str(page)), out,
               agent, hub)
    notice = dict(incident(), id="n1", severity="notice", summary="rank 0 busy")
    run.on_incident(notice)
    assert not page.exists()  # notices are not hangs
    run.on_incident(incident())
    run.on_incident(dict(incident(), id="later", summary="a later hang"))
    assert "rank 1 (stuck in read_sample_from_storage" in page.read_text()  # the first one
    assert "a later hang" not in page.read_text()

    broken = _Run(RunOptions(["job"], StallPolicy(), on_hang="kill",
                             report_html=str(tmp_path / "no" / "such" / "dir.html")), out,
                  agent, hub)
    broken.on_incident(incident())
    assert broken.kill.is_set()  # --on-hang still acts
    assert "cannot write the HTML report" in out.getvalue()


RANK_EXITED = Path(__file__).parents[1] / "fixtures" / "incidents" / "rank_exited_2_gloo.json"


def test_an_exited_culprit_shows_its_exception_frames_its_own_code_first() -> None:
    """A real RANK_EXITED incident (rank 1 raised in read_shard): the page shows the frames the
    terminal and the JSON have, the innermost frame of the user's own code named first."""
    page = incident_html(json.loads(RANK_EXITED.read_text()))
    raised = page[page.index("<h2>Culprit: rank 1</h2>"):]
    raised = raised[raised.index("it raised"):]
    assert raised.index("shard 7 is corrupt") < raised.index("read_shard")
    assert "in its own code at <b>read_shard</b> (train.py:174)" in raised
    sites = re.findall(r"<td>([\w<>&;.]+)</td><td>[^<]*/(train\.py:\d+)</td>", raised)
    assert sites == [("read_shard", "train.py:174"), ("inject", "train.py:269"),
                     ("main", "train.py:354"), ("&lt;module&gt;", "train.py:380")]
