"""A job larger than an incident lists in full, played by the load generator (one agent per
node of 8, each on its own Connect stream over real gRPC) against a real `watchdog coordinator`
at its default settings: `watchdog status`, the web view and the stored incident list the
culprit and the odd ranks in full and every other rank in a group of ranks alike; `--ranks`
(and the web view's `?ranks=`) list more on demand."""

from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.helpers.daemons import status, until_verdict
from tests.helpers.harness import WATCHDOG, job_env, stop_process, stored
from tests.helpers.loadgen import SimJob, ask, run_agents
from watchdog.cli.demo import free_port
from watchdog.coordinator.alike import rank_in
from watchdog.model import FULL_ROWS, MAX_FULL_ROWS

WORLD = 4 * FULL_ROWS
SIM = SimJob(WORLD, compact=False, started_at=0.0)
SEEN_DEADLINE_S = 60


def _every_rank_seen(address: str) -> dict[str, Any]:
    deadline = time.monotonic() + SEEN_DEADLINE_S
    while time.monotonic() < deadline:
        jobs = [job for job in (status(address) or {"jobs": []})["jobs"]
                if job["job_id"] == SIM.job_id]
        if jobs and len(jobs[0]["ranks"]) + sum(g["count"] for g in jobs[0]["rank_groups"]) \
                == WORLD:
            return jobs[0]
        time.sleep(0.5)
    raise AssertionError(f"not every rank seen within {SEEN_DEADLINE_S} s: {status(address)}")


def _asked(address: str, ranks: str) -> dict[str, Any]:
    out = subprocess.run([*WATCHDOG, "status", "--coordinator", address, "--job", SIM.job_id,
                          "--ranks", ranks, "--json"], capture_output=True, text=True,
                         timeout=30, check=True)
    (job,) = json.loads(out.stdout)["jobs"]
    return dict(job)


def _page(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _web_pages(web: str) -> None:
    """The job's page lists groups, each linked to its first ranks; asked, it lists them."""
    code, page = _page(f"{web}/jobs/{SIM.job_id}")
    assert code == 200
    links = re.findall(rf'href="/jobs/{SIM.job_id}\?ranks=(\d+)-(\d+)"', page)
    assert links and all(int(last) - int(first) < MAX_FULL_ROWS for first, last in links)
    assert 'data-rank="301"' not in page, "rank 301 is one of a group, not a cell of its own"
    code, page = _page(f"{web}/jobs/{SIM.job_id}?ranks=300-302")
    assert code == 200 and 'data-rank="301"' in page and 'value="300-302"' in page
    code, page = _page(f"{web}/jobs/{SIM.job_id}?ranks=0-{WORLD}")
    assert code == 400 and f"more than {MAX_FULL_ROWS} ranks" in page


def test_a_large_jobs_ranks_are_grouped_and_any_rank_is_listed_on_demand(
        tmp_path: Path) -> None:
    address, web = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    coordinator = subprocess.Popen([*WATCHDOG, "coordinator", "--listen", address,
                                    "--web-listen", web],
                                   env=job_env(tmp_path), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
    spawn = multiprocessing.get_context("spawn")
    conn, child = spawn.Pipe()
    agents = spawn.Process(target=run_agents, args=(child, address, WORLD, False, 16),
                           daemon=True)
    agents.start()
    try:
        running = _every_rank_seen(address)
        assert running["world_size"] == WORLD and running["state"] == "RUNNING"
        assert len(running["ranks"]) < FULL_ROWS, "a healthy large job is listed as groups"
        asked = _asked(address, "300-302")
        rows = {row["rank"]: row for row in asked["ranks"]}
        assert {300, 301, 302} <= rows.keys()
        assert rows[301]["host"] == SIM.node_name(301 // 8) and rows[301]["pid"] == 10_301
        _web_pages(f"http://{web}")
        assert ask(conn, 10, "hang") is not None
        hung = until_verdict(lambda: status(address), SIM.job_id)
        assert hung["verdict"]["culprit_ranks"] == [SIM.culprit]
        (incident,) = [i for i in stored(tmp_path) if i["job_id"] == SIM.job_id]
        culprit = rank_in(incident, SIM.culprit)
        assert culprit is not None and culprit["stack"][0]["function"] == \
            "read_sample_from_storage"
        other = rank_in(incident, 900)
        assert other is not None and (other["state"], other["last_collective"]["completed"]) == (
            "WAITING", False)
        assert len(incident["ranks"]) < FULL_ROWS
        assert sum(g["count"] for g in incident["rank_groups"]) + len(incident["ranks"]) == WORLD
    finally:
        agents.terminate()
        agents.join(10)
        log = stop_process(coordinator)
    assert "Traceback" not in log, log
