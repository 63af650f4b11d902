"""Node silence as the coordinator hears it: a pause of the coordinator itself (the machine
paused, the clock stepped, its loop starved) is no node's silence."""

from __future__ import annotations

from watchdog.coordinator.node_silence import NODE_TIMEOUT_S, PAUSE_S, NodeSilence

T0 = 1_700_000_000.0


def reporting(nodes: NodeSilence, node: str, until: float) -> None:
    """A report each second up to `until`, the loop turning on time between them."""
    at = T0
    while at <= until:
        nodes.heard(node, at)
        assert nodes.turn(at) == 0.0
        at += 1.0


def test_a_pause_of_the_coordinator_is_excused_for_every_node() -> None:
    nodes = NodeSilence(tick=1.0)
    reporting(nodes, "node-a", T0 + 4)
    nodes.heard("node-b", T0 + 1)  # quiet since: 3 s before the pause
    woke = T0 + 4 + 1.0 + 30.0  # the next turn, 30 s late
    assert nodes.turn(woke) == 30.0
    assert nodes.silence("node-a", woke) == (False, False)
    assert nodes.age("node-b", woke) == 4.0  # its 3 s before the pause, and one tick
    # The pause is forgiven once: a node quiet after it is unreachable as before.
    assert nodes.silence("node-b", woke + NODE_TIMEOUT_S - 4.0 + 0.1) == (True, True)


def test_a_turn_a_little_late_excuses_nothing() -> None:
    nodes = NodeSilence(tick=0.25)
    reporting(nodes, "node-a", T0 + 2)
    late = T0 + 2 + 0.25 + PAUSE_S  # a slow turn, not a pause
    assert nodes.turn(late) == 0.0
    assert nodes.age("node-a", late) == 0.25 + PAUSE_S


def test_a_report_heard_during_the_pause_is_not_pushed_into_the_future() -> None:
    nodes = NodeSilence(tick=1.0)
    reporting(nodes, "node-a", T0 + 2)
    nodes.heard("node-a", T0 + 40)  # its report was handled before the late turn
    assert nodes.turn(T0 + 40) == 37.0
    assert nodes.age("node-a", T0 + 40) == 0.0
    assert nodes.silence("node-a", T0 + 40 + NODE_TIMEOUT_S + 0.1)[1]  # unreachable


def test_the_clock_stepping_back_excuses_nothing() -> None:
    nodes = NodeSilence(tick=1.0)
    reporting(nodes, "node-a", T0 + 5)
    assert nodes.turn(T0 - 60) == 0.0
    assert nodes.silence("node-a", T0 - 60) == (False, False)
