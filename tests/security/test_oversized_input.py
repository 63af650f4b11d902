"""Issue 20, findings 3 and 7: what a worker controls is cut where it enters, never a reason to
drop what carries it. A user's "torchrun" worker (no hook: the root agent names its job from its
environment) with a 5000-character WATCHDOG_JOB_ID once cost its node every report, so another
user's job there was never seen to end; a rank 700 frames deep, or one long NCCL log line,
cost its node every stack, so the incident had no stacks or logs for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tests.helpers.attack import (
    AS_NOBODY,
    NOBODY,
    agent,
    clean_env,
    coordinator,
    job,
    scratch_dir,
    stored,
    verdict,
    wait_for,
    worker,
)
from tests.helpers.everyone import python
from watchdog.env import MAX_JOB_ID
from watchdog.text import MAX_TEXT, TRUNCATED
from watchdog.transport.limits import MAX_FRAMES

# A rank: `depth` calls deep in functions named `name` (in a file named `file`), where it waits
# on the first of the `children` it started, or sleeps. Each child is this script again (its
# source is in its own command line, `python3 -c SOURCE`), `child_depth` deep in functions of
# that name in a file named `child_file`, sleeping.
RANK = """
import subprocess, sys, time
depth, name, file, children, child_depth, child_file = sys.argv[1:]
scope = {"time": time}
exec(compile('''
def dive(depth, child):
    if depth:
        return dive(depth - 1, child)
    if child is not None:
        child.wait()
    while True:
        time.sleep(1)
''', file, "exec"), scope)
dive = scope["dive"]
dive.__code__ = dive.__code__.replace(co_name=name, co_qualname=name)
kids = [subprocess.Popen([*sys.orig_argv[:3], child_depth, name, child_file, "0", "0", "-"])
        for _ in range(int(children))]
dive(int(depth), kids[0] if kids else None)
"""

# Named "torchrun", it looks like torchrun; its ranks get what torchrun gives its workers.
LAUNCHER = """
import json, os, subprocess, sys, time
spec = json.loads(sys.argv[1])
world = len(spec["ranks"])
for rank, (depth, nccl) in enumerate(spec["ranks"]):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29500", TORCHELASTIC_RUN_ID="none", WATCHDOG_JOB_ID=spec["job"])
    if nccl:
        env["NCCL_DEBUG_FILE"] = nccl
    subprocess.Popen(["python3", "-c", spec["rank"], str(depth), spec["name"], "<string>",
                      str(spec["children"]), str(spec["child_depth"]), spec["child_file"]],
                     env=env)
print("launched", flush=True)
time.sleep(3600)
"""


@contextmanager
def nobodys_job(scratch: Path, job_id: str, ranks: list[tuple[int, str]],
                name: str = "dive", children: int = 0, child_depth: int = 0,
                child_file: str = "<string>") -> Iterator[None]:
    """`nobody`'s torchrun job without the hook: a rank per (recursion depth before it
    blocks, in functions called `name`; its NCCL_DEBUG_FILE or ""), until the block ends.
    With `children`, each rank starts that many and blocks waiting on the first: each
    `child_depth` deep in functions called `name`, of a file called `child_file`."""
    launcher = scratch / "torchrun"
    launcher.write_text(LAUNCHER)
    spec = json.dumps({"job": job_id, "ranks": ranks, "name": name, "rank": RANK,
                       "children": children, "child_depth": child_depth,
                       "child_file": child_file})
    # Pointed at this test's agent: only the agent of the beacon directory a worker names takes
    # it, hook or none (agent/unhooked.py), so no other test's agent judges this job.
    proc = subprocess.Popen([*AS_NOBODY, python(), str(launcher), spec], stdout=subprocess.PIPE,
                            text=True, env=clean_env(WATCHDOG_BEACON_DIR=str(scratch / "beacons")),
                            cwd="/", start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "launched\n"
        yield
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, its ranks and their children
        proc.wait()


def ended(address: str, job_id: str) -> dict[str, Any] | None:
    view = job(address, job_id)
    return view if view is not None and view["state"] in ("FINISHED", "FAILED") else None


def test_a_5000_character_job_id_is_cut_and_blinds_no_other_job() -> None:
    cut_id = "A" * (MAX_JOB_ID - len(TRUNCATED.encode())) + TRUNCATED
    legit = {"job": "legit-job", "rank": 0, "world": 1}  # root's own job, on the same node
    with scratch_dir() as scratch, coordinator(scratch) as coord, \
            agent(scratch, scratch / "beacons", "--coordinator", coord.address) as node, \
            ExitStack() as roots_job:
        roots_job.enter_context(worker({**legit, "beacon_dir": str(scratch / "beacons")}))
        wait_for(lambda: job(coord.address, "legit-job"), "root's job to be seen", 30)
        with nobodys_job(scratch, "A" * 5000, [(0, "")]):
            # The agent finds a worker without the hook within 2 s; the old coordinator then
            # refused every report of the node.
            attacker = wait_for(lambda: job(coord.address, cut_id) or (
                "rejected" in coord.output()), "the attacker's worker to be reported", 30)
            roots_job.close()  # root's job ends while the attacker's worker runs
            finished = wait_for(lambda: ended(coord.address, "legit-job"),
                                "root's job to be seen to end", 30)
        assert node.alive, node.output()
        assert "rejected" not in coord.output(), coord.output()
    assert isinstance(attacker, dict) and attacker["ranks"][0]["rank"] == 0
    assert finished["ranks"][0]["state"] == "EXITED"


def test_a_deep_stack_and_a_long_log_line_keep_every_ranks_stack_and_logs() -> None:
    warn = "node-a:1:2 [0] misc/socket.cc:49 NCCL WARN " + "x" * 10_000
    with scratch_dir() as scratch:
        nccl = scratch / "nccl.log"
        nccl.write_text(f"node-a:1:2 [0] NCCL INFO start\n{warn}\n")
        os.chown(nccl, NOBODY, -1)
        with coordinator(scratch) as coord, \
                agent(scratch, scratch / "beacons", "--coordinator", coord.address) as node, \
                nobodys_job(scratch, "deep-and-long", [(700, ""), (0, str(nccl))]):
            view = verdict(coord.address, "deep-and-long", timeout=60)
            assert node.alive, node.output()
        shown = json.loads(stored(scratch, view["verdict"]["id"]))  # Status shows no stacks
    rows = {row["rank"]: row for row in shown["ranks"]}
    assert sorted(rows) == [0, 1]
    deep = [frame["function"] for frame in rows[0]["stack"]]
    assert len(deep) == MAX_FRAMES and set(deep[:MAX_FRAMES - 1]) == {"dive"}, deep
    assert deep[-1].endswith("outer frames not shown]")
    assert rows[1]["stack"], rows[1]
    line = rows[1]["nccl_log"][-1]  # the WARN, after the lines before it
    assert line.startswith(warn[:1000]) and line.endswith(TRUNCATED)
    assert len(line.encode()) == MAX_TEXT
