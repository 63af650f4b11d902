"""When each node's agent last reported, and whether its silence means anything (coordinator).

Silence is only what the coordinator could have heard: while it did not run itself (the machine
paused, the clock stepped, its loop starved), no report could arrive, and on waking every node
would look unreachable at once. That time is excused.
"""

from __future__ import annotations

from collections.abc import Iterable

NODE_TIMEOUT_S = 15.0  # no report for this long: the node is unreachable
SILENT_INTERVALS = 3  # no report for this many report intervals: judge nothing on stale data
PAUSE_S = 2.0  # a turn of the coordinator's loop this much late: it heard nothing meanwhile


class NodeSilence:
    def __init__(self, tick: float) -> None:
        self.tick = tick
        self._seen: dict[str, float] = {}
        self._interval: dict[str, float] = {}
        self._turned_at: float | None = None

    def heard(self, node: str, now: float) -> None:
        """A report from `node` at `now`; its smoothed interval says how long silence may last."""
        previous = self._seen.get(node)
        if previous is not None:
            interval = self._interval.get(node, now - previous)
            self._interval[node] = 0.8 * interval + 0.2 * (now - previous)
        self._seen[node] = now

    def age(self, node: str, now: float) -> float:
        """Seconds since `node` last reported (0 for a node never heard)."""
        return now - self._seen.get(node, now)

    def silence(self, node: str, now: float) -> tuple[bool, bool]:
        """(silent, unreachable): silent after a few missed reports (an agent restarting),
        unreachable after NODE_TIMEOUT_S."""
        age = self.age(node, now)
        silent = age > max(SILENT_INTERVALS * self._interval.get(node, 1.0), 1.0)
        return silent, age > NODE_TIMEOUT_S

    def turn(self, now: float) -> float:
        """One turn of the coordinator's loop at `now`; returns the pause excused (0 when the
        turn came on time): every node's silence is shortened by it."""
        late = 0.0 if self._turned_at is None else now - self._turned_at - self.tick
        self._turned_at = now
        if late <= PAUSE_S:
            return 0.0
        for node, seen in self._seen.items():
            self._seen[node] = min(now, seen + late)
        return late

    def unreachable(self, nodes: Iterable[str], now: float) -> tuple[str, ...] | None:
        """Which of `nodes` are unreachable, or None while one is silent but not unreachable
        yet (a node that missed a few reports: its ranks' state is not known yet)."""
        unreachable = []
        for node in sorted(set(nodes)):
            silent, lost = self.silence(node, now)
            if silent and not lost:
                return None
            if lost:
                unreachable.append(node)
        return tuple(unreachable)

    def quiet_for(self, age: float, now: float) -> list[str]:
        """The nodes not heard from for more than `age` seconds."""
        return [node for node, seen in self._seen.items() if now - seen > age]

    def forget(self, node: str) -> None:
        self._seen.pop(node, None)
        self._interval.pop(node, None)
