"""Prometheus metrics of the agent and the coordinator (their own processes, or both inside
`watchdog run`), served over HTTP at `--metrics-listen HOST:PORT`.

One registry of this package's own, so that every name starts with `torch_hang_watchdog_` (the
process collector included) and nothing a library registers globally leaks in. Counters and
histograms are updated where things happen; the coordinator's gauges are sampled from its own
event loop (`watchdog.coordinator.gauges`), never read from the HTTP server's thread.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from watchdog.env import split_address
from watchdog.errors import UsageError

log = logging.getLogger(__name__)

NAMESPACE = "torch_hang_watchdog"
REGISTRY = CollectorRegistry()
ProcessCollector(namespace=NAMESPACE, registry=REGISTRY)

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# -- coordinator --
JOBS = Gauge("jobs", "Jobs the coordinator follows, by state", ["state"],
             namespace=NAMESPACE, registry=REGISTRY)
RANKS = Gauge("ranks", "Ranks of the jobs the coordinator follows",
              namespace=NAMESPACE, registry=REGISTRY)
AGENTS = Gauge("agents_connected", "Agents streaming to the coordinator now",
               namespace=NAMESPACE, registry=REGISTRY)
REPORTS = Counter("reports", "Node reports the coordinator ingested",
                  namespace=NAMESPACE, registry=REGISTRY)
STALLS = Counter("stalls", "Diagnoses started: a job stalled, or one of its ranks exited",
                 namespace=NAMESPACE, registry=REGISTRY)
INCIDENTS = Counter("incidents", "Incidents stored and announced, by kind and severity",
                    ["kind", "severity"], namespace=NAMESPACE, registry=REGISTRY)
VERDICTS_RESUMED = Counter(
    "verdicts_resumed", "Hang verdicts the job contradicted: it made progress again with nobody "
    "acting on the verdict (the watchdog's false alarms)", namespace=NAMESPACE, registry=REGISTRY)
VERDICT_SECONDS = Histogram(
    "verdict_latency_seconds",
    "From the start of a diagnosis to its stored incident (stacks, verdict, storage)",
    namespace=NAMESPACE, registry=REGISTRY, buckets=_SECONDS)
STRAGGLER_LOST = Gauge(
    "straggler_lost_seconds_per_step",
    "Seconds per step a job's other ranks wait for its slowest rank (a STRAGGLER notice once "
    "it persists); absent while the job's ranks have no window to compare",
    ["job"], namespace=NAMESPACE, registry=REGISTRY)
WEBHOOK_DELIVERIES = Counter("webhook_deliveries", "Incident webhook posts, by outcome",
                             ["outcome"], namespace=NAMESPACE, registry=REGISTRY)

# -- agent --
AGENT_RANKS = Gauge("agent_ranks", "Ranks the agent found on its node",
                    namespace=NAMESPACE, registry=REGISTRY)
STACK_SECONDS = Histogram(
    "stack_dump_seconds",
    "Seconds to take the stacks of one request (its ranks on this node, in parallel)",
    namespace=NAMESPACE, registry=REGISTRY, buckets=_SECONDS)
STACK_FAILURES = Counter("stack_dump_failures", "Rank stacks py-spy failed to take",
                         namespace=NAMESPACE, registry=REGISTRY)
RECONNECTS = Counter("reconnects", "Times the agent's stream to the coordinator ended or "
                     "failed and was tried again", namespace=NAMESPACE, registry=REGISTRY)


@dataclass
class MetricsServer:
    """The HTTP server that answers /metrics, in a thread of its own."""

    server: WSGIServer
    thread: threading.Thread
    host: str

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(address: str) -> MetricsServer:
    """Serve REGISTRY at http://HOST:PORT/metrics (port 0: any free one, see `.port`)."""
    host, port = split_address(address)
    try:
        server, thread = start_http_server(port, host, registry=REGISTRY)
    except OSError as e:
        raise UsageError(f"cannot serve metrics on {address}: {e.strerror or e}",
                         hint="is another process using that port?") from e
    metrics = MetricsServer(server, thread, host)
    log.info("metrics at %s", metrics.url)
    return metrics
