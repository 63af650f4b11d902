"""Issue 37, finding 9: a stack reply fits one gRPC message (agent/reply_fit.py). The agent's
own caps add up past it: a rank's 512 frames and each of its 16 children's 128, in functions
named with 4095 characters (the longest py-spy reads) and, for the children, files named so
too, encode to about 19 MB, over the 16 MiB limit. Such a reply ended the node's whole stream,
and the incident had no stacks. Now the agent cuts the children's outer frames first, with a
mark; the coordinator then bounds the incident it stores in bytes too (coordinator/fit.py), so
what reaches the incident is cut further, and marked, but there."""

from __future__ import annotations

import json
import re

from tests.helpers.attack import agent, coordinator, scratch_dir, stored, verdict
from tests.security.test_oversized_input import nobodys_job
from watchdog.transport.limits import MAX_CHILD_FRAMES, MAX_CHILDREN, MAX_FRAMES, MAX_MESSAGE_BYTES

NAME = "x" * 4095  # of every function the rank and its children wait in
CHILD_FILE = "y" * 4095  # of the children's: with names alone, the reply fits one message
TRUNCATED = "<truncated>"  # the file of the frame that marks a cut


def test_a_rank_waiting_on_16_deep_children_keeps_its_stacks_and_its_nodes_stream() -> None:
    with scratch_dir() as scratch, coordinator(scratch) as coord, \
            agent(scratch, scratch / "beacons", "--coordinator", coord.address) as node:
        with nobodys_job(scratch, "deep-children", [(MAX_FRAMES, "")], name=NAME,
                         children=MAX_CHILDREN, child_depth=MAX_CHILD_FRAMES,
                         child_file=CHILD_FILE):
            view = verdict(coord.address, "deep-children", timeout=120)
        assert node.alive, node.output()
        log = node.output()
        shown = json.loads(stored(scratch, view["verdict"]["id"]))
    (row,) = shown["ranks"]
    stack = row["stack"]  # the rank's own: it waits on its first child, in subprocess.py
    assert stack, f"the incident has no stack of the rank: {row['state']}; agent:\n{log}"
    assert stack[0]["file"].endswith("/subprocess.py"), stack[0]
    assert NAME in {frame["function"] for frame in stack}
    assert stack[-1]["file"] == TRUNCATED, stack[-1]["function"][:200]
    children = row["children"]
    assert len(children) == MAX_CHILDREN, [child["error"] for child in children]
    for child in children:
        *kept, mark = child["stack"]
        assert kept and {(f["function"], f["file"]) for f in kept} == {(NAME, CHILD_FILE)}
        assert len(kept) < MAX_CHILD_FRAMES - 1, len(kept)  # cut below the agent's own cap
        assert mark["file"] == TRUNCATED and "frames not shown" in mark["function"], mark
    # The reply was over one message, cut by the agent, and its stream never broke.
    sizes = [int(size) for size in re.findall(r"was (\d+) bytes encoded, over", log)]
    assert sizes and min(sizes) > MAX_MESSAGE_BYTES, log
    assert "retrying in" not in log, log
