"""Exits settling (coordinator process): ranks that raise one error exit milliseconds apart, yet
their exits come in different reports (each agent reports once a second): a verdict on the first
alone would blame one of them. A diagnosis waits here for its peers' exits first."""

from __future__ import annotations

import asyncio
import time

from watchdog.coordinator.jobs import JobView

EXIT_SETTLE_S = 2.0


async def settle_exits(job: JobView, tick: float) -> None:
    """Where a rank raised, give its peers' exits EXIT_SETTLE_S to arrive (looking each `tick`),
    so that ranks that raised the same error are named together; no longer once every rank
    exited, or every live rank finished a step since (they train on: they did not raise)."""
    if not any(r.exit_reason is not None and r.exit_reason.exception
               for r in job.ranks.values() if not r.alive):
        return
    steps = {r.rank: r.steps for r in job.ranks.values() if r.alive}
    deadline = time.monotonic() + EXIT_SETTLE_S
    while time.monotonic() < deadline and not job.everyone_left:
        if all(r.steps > steps.get(r.rank, r.steps) for r in job.ranks.values() if r.alive):
            return
        await asyncio.sleep(tick)
