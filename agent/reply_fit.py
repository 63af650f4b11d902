"""A stack reply fits one gRPC message (issue 37, finding 9). The agent's own caps add up past
it: a rank's 512 frames and each of its 16 children's 128, of names up to 4096 characters
(three bytes each in UTF-8), make tens of MB, and a message over the limit ends the node's
whole stream: the incident then had no stacks at all. So a reply is measured as encoded and,
past the budget, loses its children's outer frames first (they are the least telling: the
rank's own stack says where it waits), then the ranks' own, in steps, each cut with a mark,
then its log lines."""

from __future__ import annotations

import dataclasses
import logging

from watchdog.frames import TRUNCATED_FILE, hidden_by
from watchdog.model import ChildStack, Frame, StackReply
from watchdog.transport.limits import MAX_MESSAGE_BYTES
from watchdog.transport.wire import stacks_to_pb

log = logging.getLogger(__name__)

# Below the message limit, with room for the AgentMessage around the reply.
MAX_REPLY_BYTES = MAX_MESSAGE_BYTES - 1024 * 1024
STEPS = (64, 16, 4, 1, 0)  # frames kept per stack, tried in turn


def fit_reply(reply: StackReply, limit: int = MAX_REPLY_BYTES) -> StackReply:
    """`reply`, cut until it encodes to at most `limit` bytes (a blocking call: run it off the
    event loop)."""
    size = _size(reply)
    if size <= limit:
        return reply
    cut = reply
    for step in (_children_frames, _ranks_frames):
        for keep in STEPS:
            cut = step(cut, keep, limit)
            if _size(cut) <= limit:
                return _said(reply, size, cut, limit)
    return _said(reply, size, _without_logs(cut), limit)


def _size(reply: StackReply) -> int:
    return int(stacks_to_pb(reply).ByteSize())


def _said(reply: StackReply, size: int, cut: StackReply, limit: int) -> StackReply:
    log.warning("the stack reply for request %d was %d bytes encoded, over %d: its frames were "
                "cut", reply.request_id, size, limit)
    return cut


def _children_frames(reply: StackReply, keep: int, limit: int) -> StackReply:
    return dataclasses.replace(reply, stacks=tuple(
        dataclasses.replace(s, children=tuple(_child(c, keep, limit) for c in s.children))
        for s in reply.stacks))


def _ranks_frames(reply: StackReply, keep: int, limit: int) -> StackReply:
    return dataclasses.replace(reply, stacks=tuple(
        dataclasses.replace(s, frames=_cut(s.frames, keep, limit)) for s in reply.stacks))


def _without_logs(reply: StackReply) -> StackReply:
    return dataclasses.replace(reply, stacks=tuple(
        dataclasses.replace(s, nccl_log=(), worker_log=()) for s in reply.stacks))


def _child(child: ChildStack, keep: int, limit: int) -> ChildStack:
    return dataclasses.replace(child, frames=_cut(child.frames, keep, limit))


def _cut(frames: tuple[Frame, ...], keep: int, limit: int) -> tuple[Frame, ...]:
    """The innermost `keep` frames and a mark saying how many more were taken (counting those
    an earlier mark said were not shown)."""
    hidden = 0
    if frames and frames[-1].file == TRUNCATED_FILE:
        frames, hidden = frames[:-1], hidden_by(frames[-1].function)
    if len(frames) <= keep:
        return (*frames, *_marks(hidden, limit))
    return (*frames[:keep], *_marks(len(frames) - keep + hidden, limit))


def _marks(hidden: int, limit: int) -> tuple[Frame, ...]:
    text = f"…[{hidden} outer frames not shown: the reply was over {limit} bytes]"
    return (Frame(text, TRUNCATED_FILE, 0),) if hidden else ()

