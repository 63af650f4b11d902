"""The protobuf adapter: what goes out comes back equal; what is too long is cut with a mark;
what is malformed is rejected, a rank of a report alone."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from watchdog.errors import MessageRejectedError
from watchdog.model import (
    DATALOADER_WORKER,
    MAX_FULL_ROWS,
    Activity,
    CheckEvidence,
    ChildStack,
    ExitReason,
    Fingerprint,
    Frame,
    GroupProgress,
    NodeReport,
    Pace,
    RankStack,
    RankState,
    StackReply,
    StackRequest,
    StatusQuery,
)
from watchdog.text import MAX_TEXT, TRUNCATED
from watchdog.transport import limits
from watchdog.transport import wire as _wire
from watchdog.transport.proto import watchdog_pb2 as pb

RANK = RankState(
    job_id="train-20261202-141736-9a601b", rank=1, local_rank=1, world_size=4, host="node-a",
    pid=4243, hooked=True, proc_state="S", heartbeat_age=0.2, steps=56, events=171,
    last_event_at=1764680003.2,
    groups=(GroupProgress("0", (), 57, "all_reduce", 56, 1764680003.2),
            GroupProgress("1", (0, 1), 5, "all_reduce", 4, 1764680001.0)),
    phase="checkpoint", phase_age=3.5, phase_timeout=600.0, progress_age=0.4,
    pace=Pace(gap_p99=0.2, gaps=212), activity=Activity(5.0, 0.31, 0.35, 1250.0, 41e6, 87.0),
    evidence=CheckEvidence(
        checks=("replica_desync", "no_grad_sync"),
        fingerprints=(Fingerprint("parameters", "0", 0, 128, 2**64 - 1),
                      Fingerprint("batch", "3", 1, 128, 42),
                      Fingerprint("optimizer", "1", 0, 128, 7)),
        unsynced_steps=3, sampler_reuses=2, sampler_reuse_step=16, sampler_epoch=0,
        ddp_change_step=8, ddp_change_module=1, ddp_change_group="3",
        ddp_change="dtype of weight: torch.float32 -> torch.float64", nonfinite_step=0,
        nonfinite_value=-float("inf")))


def through_the_wire(report: NodeReport) -> NodeReport | StackReply:
    raw = _wire.report_to_pb(report).SerializeToString()
    return _wire.agent_message_from_pb(pb.AgentMessage.FromString(raw))


RAISED = ExitReason("RuntimeError", "shard 7 is corrupt",
                    (Frame("read_shard", "/home/ml/train.py", 117),
                     Frame("main", "/home/ml/train.py", 88)))


def test_node_report_round_trip_keeps_every_field() -> None:
    exited = replace(RANK, rank=3, exited_at=1764680010.0, exit_code=1, clean_exit=False,
                     proc_state="", heartbeat_age=None, progress_age=None,
                     activity=Activity(5.0, gpu_util=None), exit_reason=RAISED, attempt=2)
    killed = replace(RANK, rank=2, exited_at=1764680009.0, exit_code=None,
                     exit_reason=ExitReason(signal="SIGKILL", oom_killed=True))
    joining = replace(RANK, rank=0, groups=(), setup="init_process_group", setup_age=12.5,
                      rendezvous="tcp://10.0.0.9:29500")
    compiling = replace(RANK, rank=1, compile_age=42.5)
    report = NodeReport("node-a", 1764680011.0, (RANK, exited, killed, joining, compiling))
    assert through_the_wire(report) == report


def test_stack_reply_round_trip() -> None:
    stack = RankStack(1, 4243, (Frame("read_sample_from_storage", "train.py", 45),),
                      nccl_log=("node-a:4243:4300 [1] misc/socket.cc:521 NCCL WARN Net : x",),
                      samples=3, moved=True)
    reply = StackReply(7, "node-a", (stack, RankStack(2, 4244, error="process 4244 has exited")))
    raw = _wire.stacks_to_pb(reply).SerializeToString()
    assert _wire.agent_message_from_pb(pb.AgentMessage.FromString(raw)) == reply


def test_equal_stacks_arrive_as_one_shared_tuple_of_frames() -> None:
    """What the coordinator reads from a stack it reads once per distinct stack
    (`frames.by_identity`): 131,072 ranks waiting in one collective send one stack."""
    frames = (Frame("all_reduce", "distributed_c10d.py", 2950), Frame("main", "train.py", 9))
    reply = StackReply(7, "node-a", tuple(RankStack(r, 4000 + r, frames) for r in range(3)))
    got = _wire.agent_message_from_pb(pb.AgentMessage.FromString(
        _wire.stacks_to_pb(reply).SerializeToString()))
    assert isinstance(got, StackReply) and got == reply
    assert got.stacks[0].frames is got.stacks[1].frames is got.stacks[2].frames


@pytest.mark.parametrize("broken", [
    replace(RANK, job_id=""),
    replace(RANK, rank=4),
    replace(RANK, world_size=0),
    replace(RANK, rank=0, world_size=limits.MAX_WORLD + 1),
    replace(RANK, local_rank=-2),
    replace(RANK, last_event_at=math.nan),
    replace(RANK, heartbeat_age=math.inf),
    replace(RANK, progress_age=math.nan),
    replace(RANK, activity=Activity(5.0, main_cpu=math.inf)),
    replace(RANK, activity=Activity(5.0, write_rate=-1.0)),
    replace(RANK, groups=(GroupProgress("1", (0, -5), 1, "all_reduce", 0, 1.0),)),
    replace(RANK, exit_reason=ExitReason(signal="\x1b[2J")),
    replace(RANK, attempt=limits.MAX_ATTEMPT),
    replace(RANK, setup_age=math.nan),
    replace(RANK, compile_age=math.inf),
    replace(RANK, compile_age=math.nan),
    replace(RANK, compile_age=-0.5),
    replace(RANK, evidence=CheckEvidence(fingerprints=(Fingerprint("loss", "0", 0, 8, 1),))),
    replace(RANK, evidence=CheckEvidence(
        fingerprints=(Fingerprint("batch", "0", 0, 8, 1),) * (limits.MAX_FINGERPRINTS + 1))),
])
def test_a_malformed_rank_state_is_dropped_alone(broken: RankState) -> None:
    healthy = replace(RANK, rank=2)
    report = NodeReport("node-a", 1.0, (broken, healthy))
    assert through_the_wire(report) == replace(report, ranks=(healthy,))


def cut(length: int, char: str = "x") -> str:
    """What a text of `length` characters arrives as."""
    if length <= MAX_TEXT:
        return char * length
    return char * (MAX_TEXT - len(TRUNCATED.encode())) + TRUNCATED


@pytest.mark.parametrize("length", [MAX_TEXT, MAX_TEXT + 1, 5000, 100_000])
def test_texts_over_the_limit_are_cut_with_a_mark_not_refused(length: int) -> None:
    long = "x" * length
    sent = replace(RANK, job_id=long, host=long, phase=long, rendezvous=long,
                   groups=(GroupProgress("1", (0, 1), 1, long, 0, 1.0),),
                   exit_reason=ExitReason("E", long, (Frame(long, long, 3),)),
                   evidence=CheckEvidence(ddp_change_step=8, ddp_change=long))
    got = through_the_wire(NodeReport("node-a", 1.0, (sent,)))
    assert isinstance(got, NodeReport)
    rank = got.ranks[0]
    assert rank.exit_reason is not None and rank.evidence.ddp_change == cut(length)
    assert {rank.job_id, rank.host, rank.phase, rank.rendezvous, rank.groups[0].entered_op,
            rank.exit_reason.message, *vars(rank.exit_reason.frames[0]).values()} == {
        cut(length), 3}
    assert len(rank.job_id.encode()) <= MAX_TEXT


def test_multibyte_texts_are_cut_on_a_character_within_the_limit() -> None:
    got = through_the_wire(NodeReport("node-a", 1.0, (replace(RANK, phase="é" * 3000),)))
    assert isinstance(got, NodeReport)
    phase = got.ranks[0].phase
    assert phase.endswith(TRUNCATED) and set(phase[:-len(TRUNCATED)]) == {"é"}
    assert MAX_TEXT - 1 <= len(phase.encode()) <= MAX_TEXT


def test_an_exit_reasons_frames_keep_the_innermost() -> None:
    frames = tuple(Frame(f"f{n}", "t.py", n) for n in range(200))
    sent = replace(RANK, exit_reason=ExitReason("E", "m", frames))
    got = through_the_wire(NodeReport("node-a", 1.0, (sent,)))
    assert isinstance(got, NodeReport) and got.ranks[0].exit_reason is not None
    assert got.ranks[0].exit_reason.frames == (
        *frames[:limits.MAX_REASON_FRAMES - 1],
        Frame(f"…[{200 - limits.MAX_REASON_FRAMES + 1} outer frames not shown]", "<truncated>", 0))


WORKER = ChildStack(4250, DATALOADER_WORKER, worker_id=1, state="S",
                    frames=(Frame("read_record", "/home/ml/data.py", 16),), moved=False, cpu=0.98)


def children_through_the_wire(*children: ChildStack) -> tuple[ChildStack, ...]:
    stack = RankStack(1, 4243, (Frame("_try_get_data", "dataloader.py", 1291),), children=children)
    raw = _wire.stacks_to_pb(StackReply(7, "node-a", (stack,))).SerializeToString()
    reply = _wire.agent_message_from_pb(pb.AgentMessage.FromString(raw))
    assert isinstance(reply, StackReply)
    return reply.stacks[0].children


def test_a_rank_stack_carries_its_children_through_the_wire() -> None:
    other = ChildStack(4251, error="py-spy took longer than 5s")
    assert children_through_the_wire(WORKER, other) == (WORKER, other)


@pytest.mark.parametrize("broken", [
    (WORKER,) * (limits.MAX_CHILDREN + 1),
    (replace(WORKER, pid=0),),
    (replace(WORKER, pid=limits.MAX_PID),),
    (replace(WORKER, worker_id=limits.MAX_WORKER_ID),),
    (replace(WORKER, role="root_shell"),),
    (replace(WORKER, state="\x1b"),),
    (replace(WORKER, cpu=math.nan),),
    (replace(WORKER, cpu=-1.0),),
])
def test_children_out_of_bounds_drop_their_ranks_stack_alone(
        broken: tuple[ChildStack, ...]) -> None:
    healthy = RankStack(2, 4244, (Frame("wait", "t.py", 1),))
    sent = StackReply(7, "node-a", (RankStack(1, 4243, children=broken), healthy))
    raw = _wire.stacks_to_pb(sent).SerializeToString()
    assert _wire.agent_message_from_pb(pb.AgentMessage.FromString(raw)) == replace(
        sent, stacks=(healthy,))


def stack_through_the_wire(stack: RankStack) -> RankStack:
    raw = _wire.stacks_to_pb(StackReply(1, "n", (stack,))).SerializeToString()
    reply = _wire.agent_message_from_pb(pb.AgentMessage.FromString(raw))
    assert isinstance(reply, StackReply)
    return reply.stacks[0]


def test_a_deep_stack_keeps_its_innermost_frames_and_says_how_many_are_not_shown() -> None:
    frames = tuple(Frame("recurse", "f.py", n) for n in range(2000))
    worker = replace(WORKER, frames=frames, error="e" * 5000)
    got = stack_through_the_wire(RankStack(0, 1, frames, children=(worker,)))
    assert got.frames == (*frames[:limits.MAX_FRAMES - 1],
                          Frame("…[1489 outer frames not shown]", "<truncated>", 0))
    child = got.children[0]
    assert child.frames[:-1] == frames[:limits.MAX_CHILD_FRAMES - 1]
    assert child.frames[-1].function == "…[1873 outer frames not shown]"
    assert child.error == cut(5000, "e")


def test_long_log_lines_are_cut_and_only_the_last_lines_kept() -> None:
    nccl = tuple(f"nccl {n}" for n in range(150))
    output = ("y" * 10_000, *(f"out {n}" for n in range(99)))
    got = stack_through_the_wire(RankStack(0, 1, nccl_log=nccl, worker_log=output))
    assert got.nccl_log == nccl
    assert got.worker_log == output[-(limits.MAX_LOG_LINES - 150):]
    alone = stack_through_the_wire(RankStack(0, 1, worker_log=output))
    assert alone.worker_log[0] == cut(10_000, "y")


def test_an_empty_message_is_rejected() -> None:
    with pytest.raises(MessageRejectedError):
        _wire.agent_message_from_pb(pb.AgentMessage())


def test_stack_requests_ask_for_a_bounded_number_of_samples() -> None:
    for asked, served in ((0, 1), (3, 3), (1000, limits.MAX_SAMPLES)):
        raw = _wire.stack_request_to_pb(StackRequest(9, "job", (0, 1), asked)).SerializeToString()
        request = _wire.coordinator_message_from_pb(pb.CoordinatorMessage.FromString(raw))
        assert request == StackRequest(9, "job", (0, 1), served)


def test_a_status_query_asks_for_ranks_in_full_within_bounds() -> None:
    query = StatusQuery("job-1", (5, 90000, 90001, 90002))
    assert _wire.status_request_from_pb(_wire.status_request_to_pb(query)) == query
    assert _wire.status_request_from_pb(pb.StatusRequest()) == StatusQuery()
    for hostile in ("9-2", "-1", "x", f"0-{MAX_FULL_ROWS}", "1,,2"):
        with pytest.raises(MessageRejectedError, match="ranks: "):
            _wire.status_request_from_pb(pb.StatusRequest(ranks=hostile))


def test_distinct_deep_stacks_never_keep_more_than_the_budget() -> None:
    """An agent may send a stream of distinct deep stacks with the longest names: what is kept
    for ranks alike to share stays within SHARED_BYTES, and equal stacks are still shared."""
    deep = tuple(Frame("f" * MAX_TEXT, "train.py", i) for i in range(limits.MAX_FRAMES - 1))
    for n in range(3 * _wire.SHARED_BYTES // (len(deep) * MAX_TEXT)):
        reply = StackReply(n, "node-a", (RankStack(0, 1, (Frame(f"g{n}", "x.py", 1), *deep)),))
        _wire.agent_message_from_pb(pb.AgentMessage.FromString(
            _wire.stacks_to_pb(reply).SerializeToString()))
        assert _wire._SHARED.cost <= _wire.SHARED_BYTES
    test_equal_stacks_arrive_as_one_shared_tuple_of_frames()
