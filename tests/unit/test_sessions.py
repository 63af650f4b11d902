"""Which connected agent speaks for which node, and which may answer which stack request."""

from __future__ import annotations

import asyncio

from watchdog.coordinator.sessions import Sessions, vouches_for
from watchdog.model import RankStack, StackReply
from watchdog.transport.rpc import AgentSession


def test_a_session_is_bound_to_the_first_node_it_reports() -> None:
    sessions, real, rogue = Sessions(), AgentSession("ipv4:10.0.0.1:1"), AgentSession("x:2")
    for session in (real, rogue):
        sessions.open(session)
    assert sessions.bind(real, "node-a", holder_silent=False)
    assert not sessions.bind(rogue, "node-a", holder_silent=False)  # held, holder alive
    assert not sessions.bind(real, "node-b", holder_silent=False)  # one node per session
    assert sessions.session_of("node-a") is real
    assert sessions.bind(rogue, "node-a", holder_silent=True)  # the holder went silent
    assert sessions.session_of("node-a") is rogue
    sessions.close(rogue)
    assert sessions.session_of("node-a") is None
    other = AgentSession("y:3")
    sessions.open(other)
    assert sessions.bind(other, "node-a", holder_silent=False)


def test_a_client_certificate_names_the_nodes_its_session_may_report() -> None:
    assert vouches_for(frozenset({"node-a.cluster.local"}), "node-a")
    assert vouches_for(frozenset({"node-a"}), "node-a")
    assert not vouches_for(frozenset({"node-ab.cluster"}), "node-a")
    sessions = Sessions()
    certified = AgentSession("p", names=frozenset({"gpu-7.example", "10.0.0.7"}))
    sessions.open(certified)
    assert not sessions.bind(certified, "gpu-8", holder_silent=False)
    assert sessions.bind(certified, "gpu-7", holder_silent=False)


def test_only_the_session_asked_answers_and_only_for_the_ranks_asked() -> None:
    async def scenario() -> StackReply:
        sessions, asked, rogue = Sessions(), AgentSession("a"), AgentSession("b")
        request = sessions.ask(asked, "job", (0, 1))
        assert request is not None
        request_id, reply = request
        forged = StackReply(request_id, "node-a", (RankStack(0, 666, error="evil"),))
        sessions.answer(rogue, forged)
        assert not reply.done()
        sessions.answer(asked, StackReply(request_id, "node-a", (
            RankStack(0, 10), RankStack(1, 11), RankStack(7, 99))))
        return await reply

    answered = asyncio.run(scenario())
    assert [s.rank for s in answered.stacks] == [0, 1]
