"""The coordinator's Prometheus gauges (coordinator process), sampled on its event loop once a
period: the HTTP server's thread never walks the jobs while reports change them."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time

from watchdog import metrics
from watchdog.coordinator.service import Coordinator
from watchdog.model import JobState

log = logging.getLogger(__name__)

PERIOD_S = 1.0


def sample(coordinator: Coordinator, now: float) -> None:
    """Jobs by state and ranks tracked, as of `now`."""
    jobs = list(coordinator.jobs.values())
    states = collections.Counter(coordinator.judgements[job.job_id].job_state(job, now)
                                 for job in jobs)
    for state in JobState:
        metrics.JOBS.labels(state.value).set(states[state])
    metrics.RANKS.set(sum(len(job.ranks) for job in jobs))


async def keep_sampled(coordinator: Coordinator, stop: asyncio.Event,
                       period: float = PERIOD_S) -> None:
    """Sample every `period` until `stop`; no error ends this loop."""
    while not stop.is_set():
        try:
            sample(coordinator, time.time())
        except Exception:
            log.exception("sampling the metrics failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
