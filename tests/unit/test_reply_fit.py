"""A stack reply fits one gRPC message (agent/reply_fit.py, issue 37, finding 9): the agent's
own caps (512 frames a rank, 16 children of 128, names and files of 4096 bytes) add up past
it; children's frames go first, each cut marked with the frames it hid."""

from __future__ import annotations

from agent.reply_fit import MAX_REPLY_BYTES, fit_reply
from watchdog.model import ChildStack, Frame, RankStack, StackReply, bounded_frames
from watchdog.transport.wire import stacks_to_pb

NAME = "€" * 4095  # 4096 bytes once bounded


def deep(count: int, limit: int) -> tuple[Frame, ...]:
    return bounded_frames([Frame(NAME, NAME, 7)] * count, limit)


def test_a_reply_of_16_deep_children_is_cut_below_the_message_limit_children_first() -> None:
    children = tuple(ChildStack(pid=100 + i, frames=deep(140, 128)) for i in range(16))
    reply = StackReply(1, "node-a", (RankStack(0, 10, frames=deep(600, 512),
                                               children=children, nccl_log=("WARN x",)),))
    assert stacks_to_pb(reply).ByteSize() > MAX_REPLY_BYTES
    cut = fit_reply(reply)
    assert stacks_to_pb(cut).ByteSize() <= MAX_REPLY_BYTES
    (rank,) = cut.stacks
    assert rank.frames == reply.stacks[0].frames and rank.nccl_log == ("WARN x",)
    child = rank.children[0]
    assert len(child.frames) == 65 and child.frames[:64] == children[0].frames[:64]
    assert child.frames[-1].function.startswith("…[76 outer frames not shown: the reply was")


def test_a_reply_within_the_limit_is_left_alone() -> None:
    reply = StackReply(1, "node-a", (RankStack(0, 10, frames=deep(600, 512)),))
    assert fit_reply(reply) is reply
