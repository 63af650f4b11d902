"""Finding 5 of issue 20: the shipped agent unit must let its log helper work. The helper takes a
worker's groups, gid and uid before it opens that worker's log; the unit's system call filter
refused setgroups (in @privileged since systemd 252), so the helper failed with EPERM on every
read and no incident ever carried another user's NCCL log.

A real agent runs as root the way the unit runs it, where no systemd runs: its capability
bounding set alone, no_new_privs, MemoryDenyWriteExecute= and its SystemCallFilter= (sets
expanded by this machine's systemd-analyze, merged as systemd merges them, EPERM for the rest:
tests/helpers/units.py), against a real coordinator and a job of `nobody` whose rank 0 writes
its own NCCL debug file, mode 0600. The filter the unit had before proves that the harness
bites: under it, the same agent reports the stacks but no log line, and says why."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers.attack import (
    AS_NOBODY,
    agent,
    clean_env,
    coordinator,
    hung_job,
    scratch_dir,
    verdict,
    worker,
)
from tests.helpers.units import Unit, under_unit

LINE = "n:1:2 [0] NCCL WARN unit-filter-b7e1"
# The agent unit's filter until issue 20.
BEFORE = ["@system-service ptrace", "~@privileged @resources"]


@pytest.mark.parametrize(("filter_lines", "nccl_log", "refused"), [
    (None, [LINE], False),
    (BEFORE, [], True),
], ids=["shipped-filter", "filter-before-issue-20"])
def test_the_log_helper_reads_a_workers_log_under_the_agent_units_filter(
        filter_lines: list[str] | None, nccl_log: list[str], refused: bool) -> None:
    wrap = under_unit(Unit.read("agent"), filter_lines)
    with scratch_dir() as scratch:
        own = scratch / "nccl.log"
        subprocess.run([*AS_NOBODY, "sh", "-c", f"umask 077; echo '{LINE}' > {own}"],
                       check=True, cwd="/")
        beacons = scratch / "beacons"
        rank0, rank1 = hung_job(beacons, "unit-filter")
        with coordinator(scratch) as coord, \
                agent(scratch, beacons, "--coordinator", coord.address, wrap=wrap) as node, \
                worker(rank0, AS_NOBODY, env=clean_env(NCCL_DEBUG_FILE=str(own))), \
                worker(rank1, AS_NOBODY):
            view = verdict(coord.address, "unit-filter")
            agent_log = node.output()
            assert node.alive, agent_log
    rows = {row["rank"]: row for row in view["verdict"]["ranks"]}
    assert all(rows[rank]["stack"] for rank in (0, 1)), agent_log  # py-spy, under the filter
    assert rows[0]["nccl_log"] == nccl_log, agent_log
    # Other tests' jobs on this machine may leave lines of their own: this one names the file.
    refusal = (rf"not reading \S*{re.escape(str(own))} for rank 0 of unit-filter: "
               r"\[Errno 1\] Operation not permitted")
    assert bool(re.search(refusal, agent_log)) == refused, agent_log
