"""Issue 37, finding 1: what leaves the coordinator is bounded in encoded bytes. Texts were
bounded in characters and stacks in frames, but JSON gives a control character six bytes: a
rank of `nobody`'s waiting 600 calls deep in functions named 4095 `\\x01`s made an incident of
tens of MB, and the open verdict, riding in every Status reply, broke `watchdog status` for
every job on the coordinator ("Sent message larger than max"). Here 6 ranks wait 160 calls deep:
each py-spy dump stays under the agent's bound on what it reads, and the incident they make
was still over 20 MB before (over the 16 MiB message limit)."""

from __future__ import annotations

import json

from tests.helpers.attack import (
    agent,
    coordinator,
    job,
    scratch_dir,
    stored,
    verdict,
    wait_for,
    worker,
)
from tests.security.test_oversized_input import nobodys_job
from watchdog.coordinator.fit import MAX_INCIDENT_BYTES, MAX_STATUS_BYTES


def test_a_stack_of_control_characters_breaks_no_status() -> None:
    legit = {"job": "legit-job", "rank": 0, "world": 1}  # root's own job, on the same node
    with scratch_dir() as scratch, coordinator(scratch) as coord, \
            agent(scratch, scratch / "beacons", "--coordinator", coord.address), \
            worker({**legit, "beacon_dir": str(scratch / "beacons")}):
        wait_for(lambda: job(coord.address, "legit-job"), "root's job to be seen", 30)
        with nobodys_job(scratch, "control-stack", [(160, "")] * 6, name="\x01" * 4095):
            view = verdict(coord.address, "control-stack", timeout=90)
            roots = job(coord.address, "legit-job")
        shown = stored(scratch, view["verdict"]["id"])
    assert roots is not None  # its status answered
    assert len(json.dumps(view)) <= MAX_STATUS_BYTES  # the job's share of a Status reply
    assert len(shown.encode()) <= MAX_INCIDENT_BYTES
    frames = [frame["function"] for row in json.loads(shown)["ranks"] for frame in row["stack"]]
    assert frames and frames[0].startswith("\\x01\\x01"), frames[:1]
    assert "\x01" not in shown
