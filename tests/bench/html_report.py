"""The HTML report of a large hang (a script, not a test): `python -m tests.bench.html_report`.

For each job size, a synthetic DDP job as the coordinator sees it (tests/helpers/loadgen.py's
SimJob: one rank stuck reading data, every other rank waiting in the next all_reduce, NCCL
warnings on a few ranks), diagnosed by the real verdict engine and built into a real incident.
Prints: the incident JSON's size, the time `watchdog.report` takes to render it (CPU), the
page's size (target < 2 MB at 4,096 ranks), and what headless Chromium (Debian's, through
Playwright) takes to show it: navigation start to the load event and to the first contentful
paint (target < 2 s at 4,096 ranks), the median of a few loads. The page is kept for a look.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.helpers.browser import chromium
from tests.helpers.loadgen import SimJob
from watchdog.coordinator.incident import build_incident
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.verdict import decide
from watchdog.report import incident_html

NCCL_WARN = ("node-{node:05d}:{pid}:{tid} [{local}] misc/socket.cc:49 NCCL WARN socketProgress: "
             "Connection closed by remote peer node-{peer:05d}<42107>")
STALL_S = 10.0


def synthetic_incident(world_size: int) -> dict[str, Any]:
    now = time.time()
    sim = SimJob(world_size, compact=True, started_at=now - 120, hung_at=now - STALL_S - 3)
    policy = StallPolicy(fixed=STALL_S)
    job = sim.job_view(now, policy)
    job.observe(now - STALL_S - 2)
    stacks = {rank: sim.stack(rank) for rank in range(world_size)}
    for rank in range(0, world_size, max(1, world_size // 8)):  # a few ranks saw the peer go
        line = NCCL_WARN.format(node=rank // 8, pid=10_000 + rank, tid=20_000 + rank,
                                local=rank % 8, peer=sim.culprit // 8)
        stacks[rank] = dataclasses.replace(stacks[rank], nccl_log=(line,))
    snapshot = job.snapshot(now, stacks)
    verdict = decide(snapshot)
    assert verdict is not None and verdict.culprit_ranks == (sim.culprit,), verdict
    return build_incident(snapshot, verdict, f"bench{world_size}", now)


def chromium_times(page_path: Path, loads: int) -> tuple[float, float]:
    """Median seconds from navigation start to the load event, and to the first paint."""
    load, paint = [], []
    with chromium() as browser:
        for _ in range(loads):
            # The page's own policy forbids scripts: the measuring ones come in past it.
            page = browser.new_page(viewport={"width": 1280, "height": 900}, bypass_csp=True)
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_function("performance.getEntriesByName('first-contentful-paint')"
                                   ".length > 0")
            times = page.evaluate(
                "() => [performance.getEntriesByType('navigation')[0].loadEventEnd,"
                " performance.getEntriesByName('first-contentful-paint')[0].startTime]")
            load.append(times[0] / 1000)
            paint.append(times[1] / 1000)
            page.close()
    return statistics.median(load), statistics.median(paint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 1024, 4096, 16384])
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="html-report-bench-"))
    print(f"{'ranks':>6}  {'incident JSON':>13}  {'render (CPU)':>12}  {'page':>9}  "
          f"{'Chromium load':>13}  {'first paint':>11}")
    for world_size in args.ranks:
        incident = synthetic_incident(world_size)
        start = time.process_time()
        page = incident_html(incident)
        rendered = time.process_time() - start
        path = out / f"incident-{world_size}.html"
        path.write_text(page, encoding="utf-8")
        load, paint = chromium_times(path, args.loads)
        print(f"{world_size:>6}  {len(json.dumps(incident)) / 1e6:>10.2f} MB  {rendered:>10.3f} s  "
              f"{path.stat().st_size / 1e6:>6.2f} MB  {load:>11.3f} s  {paint:>9.3f} s",
              flush=True)
    print(f"pages kept in {out}")


if __name__ == "__main__":
    main()
