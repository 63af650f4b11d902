"""What the Prometheus metrics cost the coordinator (a script, not a test):
`python -m tests.bench.metrics_cost [--ranks 16384]`.

Prints, in CPU time of this process: one node report ingested with and without its counter
(the counter's share of ingest), one sample of the coordinator's gauges (jobs by state, ranks:
once a second when metrics are served), and one scrape of /metrics rendered by the registry.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

from prometheus_client import generate_latest

from tests.helpers.loadgen import RANKS_PER_NODE, SimJob
from watchdog import metrics
from watchdog.coordinator import Coordinator, StallPolicy
from watchdog.coordinator.gauges import sample
from watchdog.coordinator.sqlite_store import SqliteStore


def cpu_seconds(call: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        call()
        times.append(time.process_time() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=16384)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        coordinator = Coordinator(SqliteStore(f"{tmp}/i.db"), StallPolicy())
        now = time.time()
        sim = SimJob(args.ranks, compact=True, started_at=now - 60)
        reports = [sim.report(node, now, listed=False) for node in range(sim.nodes)]

        def ingest_all() -> None:
            for report in reports:
                coordinator.ingest(report, now)

        with_counter = statistics.median(cpu_seconds(ingest_all, 5))
        counter = metrics.REPORTS.inc
        metrics.REPORTS.inc = lambda *a, **k: None  # type: ignore[method-assign]
        try:
            without = statistics.median(cpu_seconds(ingest_all, 5))
        finally:
            metrics.REPORTS.inc = counter  # type: ignore[method-assign]
        gauges = statistics.median(cpu_seconds(lambda: sample(coordinator, now), 5))
        scrape = statistics.median(cpu_seconds(lambda: generate_latest(metrics.REGISTRY), 20))
        coordinator.store.close()
    nodes = len(reports)
    print(f"{args.ranks} ranks, {nodes} nodes of {RANKS_PER_NODE}")
    print(f"ingest, per node report: {with_counter / nodes * 1e6:.1f} us with the counter, "
          f"{without / nodes * 1e6:.1f} us without")
    print(f"gauges sample (once a second while metrics are served): {gauges * 1e3:.2f} ms")
    print(f"/metrics rendered: {scrape * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
