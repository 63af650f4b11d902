"""Rule 2.1, NODE_UNREACHABLE: a node's agent stopped reporting. Its ranks' state is unknown,
so no rank is blamed; naming the node is the honest answer."""

from __future__ import annotations

from watchdog.coordinator.view import StallView
from watchdog.model import Kind, Verdict
from watchdog.text import ranks_text


def judge(job: StallView) -> Verdict | None:
    snapshot = job.snapshot
    if not snapshot.unreachable_nodes:
        return None
    lost = [r for r, node in sorted(snapshot.rank_nodes.items())
            if node in snapshot.unreachable_nodes]
    node = snapshot.unreachable_nodes[0]
    summary = (f"node {', '.join(snapshot.unreachable_nodes)} stopped reporting: the state of "
               f"{ranks_text(lost) if lost else 'its ranks'} is unknown; the job made no "
               f"progress for {snapshot.stalled_for:.0f} s")
    return Verdict(Kind.NODE_UNREACHABLE, summary, (), job.waiters(excluding=lost), node=node)
