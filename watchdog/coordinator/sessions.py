"""Which connected agent speaks for which node, and which may answer which stack request
(coordinator process).

Every agent holds the same agent credential, so credentials alone do not say which node a
connection is. A session is bound to the first node name it reports (and, with client
certificates, only to a name its certificate vouches for); while it is connected and not
silent, no other session may report that node. A stack request is answered by the session it
was sent to, for the ranks it was asked about, or not at all.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

from watchdog.model import StackReply, StackRequest
from watchdog.text import printable
from watchdog.transport.rpc import AgentSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Asked:
    session: AgentSession
    ranks: frozenset[int]
    reply: asyncio.Future[StackReply]


def vouches_for(names: frozenset[str], node: str) -> bool:
    """A certificate for `node` or for `node.some.domain` vouches for node name `node`."""
    return any(name == node or name.split(".", 1)[0] == node for name in names)


class Sessions:
    def __init__(self) -> None:
        self.connected: set[AgentSession] = set()
        self._by_node: dict[str, AgentSession] = {}
        self._asked: dict[int, _Asked] = {}
        self._request_ids = itertools.count(1)
        self._warned: dict[AgentSession, set[str]] = {}  # what each was told off for, once

    def open(self, session: AgentSession) -> None:
        self.connected.add(session)

    def close(self, session: AgentSession) -> None:
        self.connected.discard(session)
        self._warned.pop(session, None)
        if self._by_node.get(session.node) is session:
            del self._by_node[session.node]

    def bind(self, session: AgentSession, node: str, holder_silent: bool) -> bool:
        """Whether `session` may report for `node` (binding it on its first report); a refusal
        is logged once per session. `holder_silent`: the session that holds the node stopped
        reporting, so another (the agent, restarted) may take the node over."""
        reason = self._refusal(session, node, holder_silent)
        if reason:
            self._warn_once(session, "report", "ignoring reports from %s: %s", session.peer,
                            printable(reason))
            return False
        session.node = node
        self._by_node[node] = session
        return True

    def _refusal(self, session: AgentSession, node: str, holder_silent: bool) -> str:
        if session.node and session.node != node:
            return f"it reports for node {session.node} and now names {node}"
        if session.names is not None and not vouches_for(session.names, node):
            return f"its certificate names {', '.join(sorted(session.names))}, not {node}"
        holder = self._by_node.get(node)
        if holder is not None and holder is not session and holder in self.connected and (
                not holder_silent):
            return f"node {node} is reported by another connected agent ({holder.peer})"
        return ""

    def _warn_once(self, session: AgentSession, kind: str, message: str, *args: object) -> None:
        """Log a session's misbehaviour once per kind: a rogue agent must not flood the log."""
        told = self._warned.setdefault(session, set())
        if kind not in told:
            told.add(kind)
            log.warning(message, *args)

    def session_of(self, node: str) -> AgentSession | None:
        return self._by_node.get(node)

    def ask(self, session: AgentSession, job_id: str, ranks: tuple[int, ...], samples: int = 1
            ) -> tuple[int, asyncio.Future[StackReply]] | None:
        """Send a stack request to `session` (`samples` stacks of each rank); None when its
        queue is full."""
        if session.outbox.full():
            return None
        request_id = next(self._request_ids)
        reply: asyncio.Future[StackReply] = asyncio.get_running_loop().create_future()
        self._asked[request_id] = _Asked(session, frozenset(ranks), reply)
        session.outbox.put_nowait(StackRequest(request_id, job_id, ranks, samples))
        return request_id, reply

    def answer(self, session: AgentSession, reply: StackReply) -> None:
        """Take a stack reply: only from the session asked, only for the ranks asked."""
        asked = self._asked.get(reply.request_id)
        if asked is None:
            return
        if asked.session is not session:
            self._warn_once(session, "answer", "ignoring an answer to stack request %d from %s: "
                            "it was sent to %s", reply.request_id, session.peer,
                            asked.session.peer)
            return
        del self._asked[reply.request_id]
        if not asked.reply.done():
            asked.reply.set_result(StackReply(
                reply.request_id, reply.node,
                tuple(s for s in reply.stacks if s.rank in asked.ranks)))

    def forget(self, request_id: int) -> None:
        self._asked.pop(request_id, None)
