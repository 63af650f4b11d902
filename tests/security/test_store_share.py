"""Issue 37, finding 7: the store's byte budget dropped the oldest incidents of any job, so one
user's large incidents deleted everyone's history (at the default 256 MiB, nine incidents of
the 8 MiB bound do it; scaled down here to the smallest budget, 1 MiB). Now the owner whose
incidents take the most bytes loses its oldest first."""

from __future__ import annotations

import subprocess
from contextlib import ExitStack

from tests.helpers.attack import (
    agent,
    coordinator,
    hung_job,
    scratch_dir,
    stored,
    verdict,
    worker,
)
from tests.security.test_oversized_input import nobodys_job


def test_one_users_large_incidents_evict_no_other_users_incident() -> None:
    with scratch_dir() as scratch, coordinator(scratch, "--keep-mib", "1") as coord, \
            agent(scratch, scratch / "beacons", "--coordinator", coord.address), \
            ExitStack() as roots_job:
        for spec in hung_job(scratch / "beacons", "roots-job"):
            roots_job.enter_context(worker(spec))
        roots = verdict(coord.address, "roots-job", timeout=90)["verdict"]["id"]
        stored(scratch, roots)  # stored: `incidents show` fails on an id it does not have
        with nobodys_job(scratch, "nobodys-large", [(200, "")] * 2, name="a" * 4095):
            large = verdict(coord.address, "nobodys-large", timeout=90)["verdict"]["id"]
        assert len(stored(scratch, large)) > 1 << 20  # over the whole budget alone
        try:
            stored(scratch, roots)
        except subprocess.CalledProcessError as e:
            raise AssertionError(f"root's incident was evicted: {e.stderr}") from None
