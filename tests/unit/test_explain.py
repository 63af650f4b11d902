"""`watchdog explain`: every line of every real log fixture, variants of each, torchrun's summary
and the early-exit culprit, and the CLI body (JSON, text, unreadable and binary inputs)."""

from __future__ import annotations

import io
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchdog.explain import (
    CulpritLedger,
    FirstFailure,
    InferredFinding,
    LogFinding,
    SummaryFinding,
    classify_line,
    explain_lines,
    explain_main,
)
from watchdog.explain.advice import (
    ADVICE,
    API_MISUSE,
    COLLECTIVE_TIMEOUT,
    CONNECT_FAILED,
    DESYNC,
    ENV_MISSING,
    GPU_OOM,
    IB_ERROR,
    INVALID_RANK,
    NCCL_ERROR,
    ONE_GPU_PER_RANK_FIX,
    PEER_EXITED,
    PORT_IN_USE,
    RENDEZVOUS,
    SAME_ENVIRONMENT_FIX,
    SHM,
    VERSION_MISMATCH,
    WATCHDOG_STUCK,
)
from watchdog.explain.rules import NEEDLES, RULES, ranks_named, split_prefix
from watchdog.explain.scan import BATCH_LINES, MAX_LINE_CHARS
from watchdog.explain.versions import ComparedFinding

# Real lines copied from shared/fixtures/logs (see SOURCES.md there).
FIXTURES = Path(__file__).parents[1] / "fixtures" / "logs"
EARLY_EXIT = FIXTURES / "torchrun_early_exit_gloo.log"

# Every line of every fixture: line number -> (category, ranks); every other line is no finding.
FIXTURE_FINDINGS: dict[str, dict[int, tuple[str, tuple[int, ...]]]] = {
    "nccl_errors.log": {
        # 1: "Call to connect returned Connection refused, retrying" is an INFO retry, and
        # 8-9: the "-> 6" INFO lines are the call trace of the WARN on line 7.
        3: (PEER_EXITED, ()),  # [6] is the CUDA device, not a rank
        5: (CONNECT_FAILED, ()),
        7: (IB_ERROR, ()),
        11: (GPU_OOM, ()),
    },
    "nccl_init_info.log": {},  # init INFO, VERSION lines: "rank 4 nranks 8" is not a finding
    # 2-6: version lines, compared (below); 8: two ranks on one GPU
    "nccl_version_mismatch.log": {8: (INVALID_RANK, (1, 0))},
    "torch_init_errors.log": {1: (PORT_IN_USE, ()), 2: (ENV_MISSING, ())},
    "torch_nccl_timeout.log": {
        1: (COLLECTIVE_TIMEOUT, (7,)),
        # 2: the watchdog's "Exception (either an error or timeout)" restates line 1
        3: (NCCL_ERROR, ()),
        # 4: "ncclInternalError: Internal check failed." is the second line of line 3's error
    },
    "torchrun_early_exit_gloo.log": {17: (PEER_EXITED, (3,)), 30: (PEER_EXITED, (1,)),
                                     43: (PEER_EXITED, (0,))},
    # 14, 25: the traceback's source line `raise ValueError("sampler option ...")` restates it
    "torchrun_sampler_shuffle_gloo.log": {15: (API_MISUSE, (0,)), 26: (API_MISUSE, (1,))},
    # The ranks' own errors (a RuntimeError of the user's) are no finding: the first failure.
    "torchrun_rank_raised_2_gloo.log": {19: (PEER_EXITED, (0,))},
    "torchrun_rank_raised_4_gloo.log": {19: (PEER_EXITED, (1,)), 30: (PEER_EXITED, (3,))},
    "torchrun_record_rank_raised_2_gloo.log": {25: (PEER_EXITED, (0,)), 67: (PEER_EXITED, (0,))},
    "watchdog_run_rank_raised_2_gloo.log": {26: (PEER_EXITED, (0,))},
    "watchdog_run_hang_killed_2_gloo.log": {},
}


def line_findings(findings: list[LogFinding]) -> dict[int, tuple[str, tuple[int, ...]]]:
    plain = [f for f in findings
             if not isinstance(f, SummaryFinding | InferredFinding | ComparedFinding)]
    return {finding.line_no: (finding.category, finding.ranks) for finding in plain}


def explain_file(path: Path) -> list[LogFinding]:
    with path.open(encoding="utf-8") as stream:
        return list(explain_lines(stream))


def test_every_fixture_file_has_a_table() -> None:
    assert {path.name for path in FIXTURES.glob("*.log")} == set(FIXTURE_FINDINGS)


@pytest.mark.parametrize("name", sorted(FIXTURE_FINDINGS))
def test_every_fixture_line(name: str) -> None:
    findings = explain_file(FIXTURES / name)
    assert line_findings(findings) == FIXTURE_FINDINGS[name]
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    alone = {n: classify_line(n, line) for n, line in enumerate(lines, 1)}
    # Alone, a line of torchrun's summary does not know the entry (the rank) it belongs to.
    assert {n: f.category for n, f in alone.items() if f} == {
        n: category for n, (category, _) in FIXTURE_FINDINGS[name].items()}


def first_failure(findings: list[LogFinding]) -> LogFinding | None:
    """What `watchdog explain` names as the first failure of these findings."""
    chooser = FirstFailure()
    for finding in findings:
        chooser.note(finding)
    chosen = chooser.result()
    return chosen[0] if chosen else None


def early_exit_culprit(findings: list[LogFinding]) -> InferredFinding | None:
    """The early-exit inference recomputed from findings already made."""
    ledger = CulpritLedger()
    for finding in findings:
        ledger.note(finding)
    return ledger.culprit()


def test_torchrun_summary_puts_its_root_cause_first() -> None:
    summaries = [f for f in explain_file(EARLY_EXIT) if isinstance(f, SummaryFinding)]
    assert [(s.line_no, s.category, s.ranks) for s in summaries] == [(66, PEER_EXITED, (1, 3, 0))]
    assert summaries[0].text.splitlines()[0] == "Failures:"
    assert "root cause (first observed failure) is rank 1 (exit code 1)" in summaries[0].cause
    assert "rank 0 (exit code -15, SIGTERM: stopped by torchrun" in summaries[0].cause


def test_early_exit_culprit_is_the_rank_that_reported_nothing() -> None:
    findings = explain_file(EARLY_EXIT)
    culprit = findings[-1]
    assert isinstance(culprit, InferredFinding)
    assert (culprit.line_no, culprit.category, culprit.ranks) == (66, PEER_EXITED, (2,))
    assert "torchrun's 'Root Cause' (rank 1) is a victim" in culprit.cause
    assert first_failure(findings) is culprit
    assert early_exit_culprit(findings[:-1]) == culprit


def peer_error(rank: int) -> str:
    return (f"[rank{rank}]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed"
            f" by peer [10.0.0.{rank + 1}]:4000{rank}.")


def test_culprit_without_torchrun_summary_anchors_on_the_first_peer_error() -> None:
    findings = list(explain_lines(["step 10", peer_error(3), peer_error(0), peer_error(1)]))
    culprit = findings[-1]
    assert isinstance(culprit, InferredFinding)
    assert (culprit.line_no, culprit.ranks) == (2, (2,))
    assert "torchrun" not in culprit.cause


@pytest.mark.parametrize("ranks", [[0, 1, 2, 3], [1016, 1017, 1018, 1023], [5, 7]])
def test_no_culprit_when_no_rank_is_missing_or_most_are(ranks: list[int]) -> None:
    findings = list(explain_lines([peer_error(rank) for rank in ranks]))
    assert not any(isinstance(finding, InferredFinding) for finding in findings)


def test_cause_beats_symptoms_as_first_failure() -> None:
    oom = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    findings = list(explain_lines([peer_error(0), oom, peer_error(1), peer_error(2)]))
    chosen = first_failure(findings)
    assert chosen is not None
    assert (chosen.line_no, chosen.category, chosen.ranks) == (2, GPU_OOM, (3,))


# Lines as other hosts, pids, addresses, NCCL versions and log collectors print them.
VARIANTS: list[tuple[str, str, tuple[int, ...]]] = [
    ("[2025-03-01 10:00:00] node-7:1234:1300 [3] misc/socket.cc:50 NCCL WARN socketProgress: "
     "Connection closed by remote peer node-3.cluster<42107>", PEER_EXITED, ()),  # 2.26+
    ("gpu-a:99:120 [2] misc/socket.cc:48 (socketProgress) NCCL WARN socketProgress: Connection "
     "closed by remote peer 10.1.2.3<4000>", PEER_EXITED, ()),  # 2.30.7+ with (func)
    ("[rank5]:[E1202 13:07:10.1 ProcessGroupNCCL.cpp:542] [Rank 5] Collective WorkNCCL(SeqNum=89, "
     "OpType=ALLREDUCE) raised the following async exception: NCCL error: remote process exited "
     "or there was a network error", PEER_EXITED, (5,)),
    ("[rank3]: torch.distributed.DistBackendError: [3] is setting up NCCL communicator and "
     "retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') "
     "got error: failed to recv, got 0 bytes", PEER_EXITED, (3,)),
    ("h:1:2 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to [fd00::1:7]<45763> "
     "failed : Connection refused", CONNECT_FAILED, ()),
    ("dgx-12:7:7 [1] NCCL WARN NET/Socket : Connect to 10.1.1.1<1234> failed : No route to host",
     CONNECT_FAILED, ()),  # 2.10: no file:line
    ("node-2:88:88 [0] misc/socket.cc:538 NCCL WARN socketPollConnect: connect returned Connection "
     "refused, exceeded error retry count (35)", CONNECT_FAILED, ()),
    ("[E1202 13:53:02.576873051 socket.cpp:1028] [c10d] The client socket has timed out after "
     "3000ms while trying to connect to (127.0.0.1, 29811).", CONNECT_FAILED, ()),
    ("node1:4242:4300 [0] transport/net_ib.cc:1230 NCCL WARN NET/IB : Got completion with error "
     "12, opcode 1, len 0, vendor err 129", IB_ERROR, ()),
    ("c-3:5:9 [7] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_modify_qp failed with 110 Connection "
     "timed out", IB_ERROR, ()),
    ("g-1:2:3 [4] transport/net_ib.cc:2100 NCCL WARN NET/IB: Got completion from peer 10.2.0.9<5> "
     "with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.2.0.8 hca mlx5_3",
     IB_ERROR, ()),
    ("[2026-01-02 03:04:05] g-1:2:3 [4] net_ib/gin.cc:88 (ncclIbGinTest) NCCL WARN NET/IB/GIN: Got "
     "completion from peer 10.2.0.9<5> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0)",
     IB_ERROR, ()),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
     "capacity of 79.15 GiB of which 1.2 GiB is free.", GPU_OOM, ()),
    ("node:1:1 [0] misc/shmutils.cc:113 NCCL WARN Error while creating shared memory segment "
     "/dev/shm/nccl-UbzKZ9 (size 9637888)", SHM, ()),
    ("3d3e22c3066f:168:168 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend "
     "/dev/shm/nccl-UbzKZ9 to 9637892 bytes", SHM, ()),
    ("RuntimeError: DataLoader worker (pid 123) is killed by signal: Bus error. It is possible "
     "that dataloader's workers are out of shared memory.", SHM, ()),
    ("[rank1]:[E1003 18:37:01.832146912 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, "
     "NumelOut=1, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.",
     COLLECTIVE_TIMEOUT, (1,)),
    ("[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
     "unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete",
     COLLECTIVE_TIMEOUT, (0,)),
    ("[rank2]:[E1202 13:07:10.0 ProcessGroupNCCL.cpp:1423] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
     "Heartbeat monitor timed out! Process will be terminated after dumping debug info. "
     "workMetaList_.size()=1", WATCHDOG_STUCK, (2,)),
    ("[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
     "NCCLUtils.hpp:275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
     "version 2.20.5", NCCL_ERROR, (1,)),
    ("n:1:1 [0] enqueue.cc:900 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
     NCCL_ERROR, ()),
    ("torch.distributed.DistNetworkError: The server socket has failed to bind to [::]:29500 "
     "(errno: 98 - Address already in use).", PORT_IN_USE, ()),
    ("ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
     "variable MASTER_ADDR expected, but not set", ENV_MISSING, ()),
    ("[rank3]: KeyError: 'LOCAL_RANK'", ENV_MISSING, (3,)),
    ("node:1:1 [0] init.cc:1800 NCCL WARN Invalid rank requested : 4/4", INVALID_RANK, (4,)),
    ("node:1:1 [0] init.cc:700 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA "
     "device 1000", INVALID_RANK, (1, 0)),
    ("[rank6]: torch.AcceleratorError: CUDA error: invalid device ordinal", INVALID_RANK, (6,)),
    ("torch.distributed.DistStoreError: Timed out after 4 seconds waiting for clients. 1/2 "
     "clients joined.", RENDEZVOUS, ()),
    ("h:1:1 [0] bootstrap.cc:150 NCCL WARN Bootstrap Root : rank 3 of 8 ranks has already checked "
     "in", RENDEZVOUS, (3,)),
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", RENDEZVOUS, ()),
    ("\t - To our best knowledge, ranks [1, 3] are the lagging ranks that caused this timeout. "
     "They never joined any collectives", DESYNC, (1, 3)),
    ("\t   - [47] joined but didn't finish collective #41207 (count from 1)", DESYNC, (47,)),
    ("\t     [0, 1, 2] finished collective #41207, but didn't join collective #41208 (count from "
     "1)", DESYNC, (0, 1, 2)),
    ("[rank0]:[E1202 13:53:26.185405896 ProcessGroupGloo.cpp:67] [Rank 0]: Ranks 1, 3 failed to "
     "pass monitoredBarrier in 3000 ms", DESYNC, (1, 3)),
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
     "CollectiveFingerPrint(OpType=ALLREDUCE, TensorShape=[4]), but Rank 2 is running collective: "
     "CollectiveFingerPrint(OpType=BROADCAST).", DESYNC, (0, 2)),
    ("[rank2]:[E1202 13:53:26.1 ProcessGroupGloo.cpp:67] Rank 2 successfully reached "
     "monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please "
     "check rank 0 logs for faulty rank.", DESYNC, ()),
    # What torch 2.13 raises for mistakes in the training code (CPU, gloo, 2 ranks), verbatim.
    ("[rank0]: ValueError: sampler option is mutually exclusive with shuffle", API_MISUSE, (0,)),
    ("ValueError: Default process group has not been initialized, please make sure to call "
     "init_process_group.", API_MISUSE, ()),
    ("ValueError: trying to initialize the default process group twice!", API_MISUSE, ()),
    ("ValueError: DistributedDataParallel device_ids and output_device arguments only work with "
     "single-device/multiple-device GPU modules or CPU modules, but got device_ids [0], "
     "output_device None, and module parameters {device(type='cpu')}.", API_MISUSE, ()),
    ("RuntimeError: DistributedDataParallel is not needed when a module doesn't have any "
     "parameter that requires a gradient.", API_MISUSE, ()),
    ("[rank1]: RuntimeError: Expected to have finished reduction in the prior iteration before "
     "starting a new one. This error indicates that your module has parameters that were not "
     "used in producing loss. You can enable unused parameter detection by passing the keyword "
     "argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and "
     "by ", API_MISUSE, (1,)),
    ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of "
     "the following reasons: 1) Use of a module parameter outside the `forward` function.",
     API_MISUSE, ()),
    ("RuntimeError: DDP expects same model across all ranks, but Rank 1 has 4 params, while rank "
     "0 has inconsistent 2 params.", API_MISUSE, (1, 0)),
    ("RuntimeError: [1]: params[0] in this process with sizes [3, 2] appears not to match sizes "
     "of the same param in process 0.", API_MISUSE, ()),
    ("RuntimeError: No backend type associated with device type cpu", API_MISUSE, ()),
    # glog prefixes from torchrun's Python logging and a collector's timestamp
    ("2024-05-01T12:00:00.123Z E1202 13:07:10.834000 7640 torch/distributed/run.py:1] "
     "torch.distributed.DistNetworkError: Connection reset by peer", PEER_EXITED, ()),
]


@pytest.mark.parametrize(("line", "category", "ranks"), VARIANTS)
def test_variants(line: str, category: str, ranks: tuple[int, ...]) -> None:
    finding = classify_line(9, line)
    assert finding is not None
    assert (finding.category, finding.ranks) == (category, ranks)


BENIGN = [
    "multi-gpu-ci-runner:18062:18089 [1] NCCL INFO Call to connect returned Connection refused, "
    "retrying",
    "[W socket.cpp:558] [c10d] The client socket has failed to connect to [localhost]:18630 "
    "(errno: 99 - Cannot assign requested address).",
    "[W1202 13:53:02.577145401 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to "
    "host 127.0.0.1:29811 - retrying (try=0, timeout=3000ms, delay=1614ms)",
    "[W522 11:47:45.949247853 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=77): "
    "failed to recv, got 0 bytes",
    "[rank1]:[E1003 18:37:01.8 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 1] Process group"
    " watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE) ran for 1800017 milliseconds",
    "[rank6]:[E703 21:51:54.1 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 6] "
    "Received a dump signal due to a collective timeout from  rank 7 and we will try our best",
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    "[rank2]:   File \"/job/nccl_error_handling.py\", line 3, in <module>",
    '[rank0]:     raise ValueError("sampler option is mutually exclusive with shuffle")',
    "[default3]:[rank3]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    "NCCL version 2.21.5+cuda12.4",
    "host-2:38610:38610 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.10.6.118<0>",
    "epoch 3 step 1200 loss 0.4213 lr 3.0e-04 rank 3",
]


@pytest.mark.parametrize("line", BENIGN)
def test_benign_lines_are_not_findings(line: str) -> None:
    assert classify_line(1, line) is None


@pytest.mark.parametrize(("line", "level"), [
    ("[default3]:[rank3]: msg", ""),
    ("[2024-05-01 12:00:00] W1202 13:07:10.834000 7640 torch\\distributed\\run.py:874] msg", "W"),
    ("2024-05-01T12:00:00.123+02:00 [rank7]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] msg",
     "E"),
    ("[W522 11:47:45.949247853 TCPStore.cpp:125] msg", "W"),
    ("[E ProcessGroupNCCL.cpp:542] msg", "E"),
])
def test_prefixes_are_taken_off_the_message(line: str, level: str) -> None:
    found_level, message = split_prefix(line)
    assert (found_level, message.strip()) == (level, "msg")


def test_message_text_that_looks_like_a_prefix_stays() -> None:
    assert split_prefix("Error: foo.py:12] x") == ("", "Error: foo.py:12] x")


def test_ranks_named_reads_ranks_not_devices_hosts_or_local_ranks() -> None:
    assert ranks_named("rank3-node:12:13 [5] misc/socket.cc:50 NCCL WARN x") == ()
    assert ranks_named("failed (exitcode: 1) local_rank: 1 (pid: 7645) nranks 8") == ()
    assert ranks_named("  rank      : 3 (local_rank: 3)") == (3,)
    assert ranks_named("[rank7]:[E816] [PG 0 (default_pg) Rank 7] ranks [1, 2]") == (7, 1, 2)
    assert ranks_named("rank 99999999999 is not a rank") == ()


def summary_lines(prefix: str = "") -> list[str]:
    body = [
        "Failures:", "[1]:", "  rank      : 5 (local_rank: 1)",
        "  exitcode  : -9 (pid: 77) (SIGKILL)", "  traceback : Traceback (most recent call last):",
        "    torch.OutOfMemoryError: CUDA out of memory.", "---------------", "Root Cause "
        "(first observed failure):", "[0]:", "  rank      : 4 (local_rank: 0)",
        "  exitcode  : 1 (pid: 76)", "=" * 60,
    ]
    return [prefix + line for line in body]


@pytest.mark.parametrize("prefix", ["", "[2024-05-01 12:00:00] "])
def test_summary_entry_lines_belong_to_their_rank(prefix: str) -> None:
    findings = list(explain_lines(summary_lines(prefix)))
    assert [(f.line_no, f.category, f.ranks) for f in findings] == [
        (6, GPU_OOM, (5,)), (1, PEER_EXITED, (4, 5))]
    assert "SIGKILL (-9) is often the kernel's OOM killer" in findings[1].fix


def test_batch_boundaries_change_nothing() -> None:
    filler = [f"step {n} loss 0.5" for n in range(BATCH_LINES - 3)]
    lines = [*filler, *summary_lines(), peer_error(1)]
    findings = list(explain_lines(lines))
    assert [(f.line_no, f.ranks) for f in findings] == [
        (BATCH_LINES + 3, (5,)), (BATCH_LINES - 2, (4, 5)), (BATCH_LINES + 10, (1,))]


def test_the_fast_scan_looks_for_every_rule() -> None:
    for rule in RULES:
        assert all(any(cover in needle for cover in NEEDLES) for needle in rule.needles), rule


LINE_POOL = [line for line, _, _ in VARIANTS] + BENIGN + ["", "x" * 300, "Error: foo.py:12] x"]


@given(st.lists(st.sampled_from(LINE_POOL), max_size=40))
def test_streaming_finds_what_single_lines_find(lines: list[str]) -> None:
    streamed = list(explain_lines(lines))
    alone = [classify_line(n, line) for n, line in enumerate(lines, 1)]
    assert line_findings(streamed) == {f.line_no: (f.category, f.ranks) for f in alone if f}


def test_explain_lines_streams_an_endless_input() -> None:
    def endless() -> Iterator[str]:
        yield "VM-0:392:494 [2] enqueue.cc:43 NCCL WARN Cuda failure 'out of memory'"
        while True:
            yield "node:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"

    first = next(itertools.islice(explain_lines(endless()), 1))
    assert (first.line_no, first.category) == (1, GPU_OOM)


def test_ib_cause_names_the_completion_status() -> None:
    line = next(line for line, _, _ in VARIANTS if "IBV_WC_RETRY_EXC_ERR(12)" in line)
    finding = classify_line(1, line)
    assert finding is not None
    assert "error 12 (IBV_WC_RETRY_EXC_ERR: the peer stopped answering" in finding.cause


def test_every_category_has_advice_and_findings_use_it() -> None:
    closed_set = {PEER_EXITED, CONNECT_FAILED, IB_ERROR, GPU_OOM, SHM, COLLECTIVE_TIMEOUT,
                  WATCHDOG_STUCK, NCCL_ERROR, PORT_IN_USE, ENV_MISSING, INVALID_RANK, RENDEZVOUS,
                  DESYNC, API_MISUSE, VERSION_MISMATCH}
    # one category is found by comparing lines (explain/versions.py), never by a line's rule
    assert set(ADVICE) == closed_set == {rule.category for rule in RULES} | {VERSION_MISMATCH}
    assert all(cause and fix for cause, fix in ADVICE.values())
    finding = classify_line(1, "torch.distributed.DistNetworkError: ... EADDRINUSE")
    assert finding is not None
    assert "--master_port" in finding.fix


def test_a_mistake_gets_its_own_fix() -> None:
    finding = classify_line(1, "RuntimeError: No backend type associated with device type cpu")
    assert finding is not None
    assert "a cpu tensor" in finding.cause and "cpu:gloo,cuda:nccl" in finding.fix
    sampler = classify_line(1, "ValueError: sampler option is mutually exclusive with shuffle")
    assert sampler is not None
    assert "DistributedSampler(dataset, shuffle=True)" in sampler.fix
    assert "set_epoch" in sampler.fix


def test_processes_that_print_different_nccl_versions_are_a_version_mismatch() -> None:
    findings = explain_file(FIXTURES / "nccl_version_mismatch.log")
    (compared,) = [f for f in findings if isinstance(f, ComparedFinding)]
    assert (compared.line_no, compared.category) == (4, VERSION_MISMATCH)
    assert compared.cause.startswith("1 process of this log runs NCCL 2.18.3+cuda12.2 while 3 "
                                     "run NCCL 2.21.5+cuda12.4")
    assert compared.fix == SAME_ENVIRONMENT_FIX
    duplicate = next(f for f in findings if f.category == INVALID_RANK)
    assert duplicate.fix == ONE_GPU_PER_RANK_FIX  # what SHARED_DEVICE says of a live job
    # one process's version, however often printed, and unattributed lines compare with nothing
    assert not [f for f in explain_file(FIXTURES / "nccl_init_info.log")
                if isinstance(f, ComparedFinding)]


def test_json_output_is_one_list_of_findings(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    assert explain_main([str(EARLY_EXIT)], True, out, io.StringIO()) == 0
    parsed = json.loads(out.getvalue())
    assert [(item["line_no"], item["ranks"]) for item in parsed] == [
        (17, [3]), (30, [1]), (43, [0]), (66, [1, 3, 0]), (66, [2])]
    assert all(set(item) == {"line_no", "text", "category", "ranks", "cause", "fix"}
               for item in parsed)
    empty = io.StringIO()
    explain_main([str(FIXTURES / "nccl_init_info.log")], True, empty, io.StringIO())
    assert json.loads(empty.getvalue()) == []


def test_text_output_names_the_first_failure() -> None:
    out = io.StringIO()
    assert explain_main([str(EARLY_EXIT)], False, out, io.StringIO()) == 0
    text = out.getvalue()
    assert f"{EARLY_EXIT}:17: PEER_EXITED (rank 3)\n" in text
    assert "  fix:   " in text
    assert text.splitlines()[-1].startswith(f"first failure: {EARLY_EXIT}:66: PEER_EXITED (rank 2)")


def test_unreadable_inputs_fail_but_the_others_are_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    missing = tmp_path / "nope.log"
    status = explain_main([str(missing), str(tmp_path), str(EARLY_EXIT)], True, out, io.StringIO())
    assert status == 1
    assert len(json.loads(out.getvalue())) == 5
    errors = capsys.readouterr().err
    assert f"cannot read {missing}: No such file or directory" in errors
    assert f"cannot read {tmp_path}:" in errors


def test_binary_garbage_and_endless_lines(tmp_path: Path) -> None:
    log = tmp_path / "garbage.log"
    warn = b"VM-0:392:494 [2] enqueue.cc:43 NCCL WARN Cuda failure 'out of memory'\n"
    log.write_bytes(b"\xff\xfe\x00\x9f\n" + b"z" * (3 * MAX_LINE_CHARS) + b"\n\x00\x01" + warn)
    out = io.StringIO()
    assert explain_main([str(log)], True, out, io.StringIO()) == 0
    assert [(f["line_no"], f["category"]) for f in json.loads(out.getvalue())] == [(3, GPU_OOM)]


def test_stdin_is_read_leniently_and_left_open() -> None:
    raw = io.BytesIO(b"\xff\xfe garbage\n" + (FIXTURES / "torch_init_errors.log").read_bytes())
    stdin = io.TextIOWrapper(raw, encoding="utf-8")
    out = io.StringIO()
    assert explain_main(["-"], True, out, stdin) == 0
    assert [f["category"] for f in json.loads(out.getvalue())] == [PORT_IN_USE, ENV_MISSING]
    assert not raw.closed
    text_out = io.StringIO()
    assert explain_main([], False, text_out, io.StringIO("nothing to see\n")) == 0
    assert text_out.getvalue() == "no known failure found\n"


def test_a_failing_output_is_not_blamed_on_the_input() -> None:
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        explain_main([str(EARLY_EXIT)], False, ClosedPipe(), io.StringIO())


def test_a_failures_heading_without_torchrun_entries_is_no_finding() -> None:
    assert list(explain_lines(["Failures:", "  test_foo (tests.test_bar)", "=" * 70])) == []


def explained_first_failure(text: str) -> str:
    """The closing line of `watchdog explain` on `text`."""
    out = io.StringIO()
    assert explain_main(["-"], False, out, io.StringIO(text)) == 0
    return out.getvalue().splitlines()[-1]


@pytest.mark.parametrize(("name", "rank"), [
    ("torchrun_rank_raised_2_gloo.log", 1), ("torchrun_rank_raised_4_gloo.log", 2),
    ("watchdog_run_rank_raised_2_gloo.log", 1), ("torchrun_record_rank_raised_2_gloo.log", 1)])
def test_the_first_failure_is_the_rank_that_raised_not_the_peers_it_left(name: str,
                                                                         rank: int) -> None:
    """torchrun's summary and the other ranks' closed connections come too; the first
    failure is the rank's own exception, its message and its innermost frame of user code."""
    first = explained_first_failure((FIXTURES / name).read_text(encoding="utf-8"))
    assert re.match(rf"first failure: <stdin>:\d+: rank {rank} raised RuntimeError: shard 7 is "
                    r"corrupt: checksum mismatch, in load_shard at /home/user/job/raise\w*\.py:5 ",
                    first), first


def test_a_ranks_error_file_in_torchruns_summary_is_its_own_error() -> None:
    """Without the ranks' prefixed output, the traceback torchrun inlines from the error file
    of a script under @record names the rank."""
    lines = (FIXTURES / "torchrun_record_rank_raised_2_gloo.log").read_text(encoding="utf-8")
    summary_only = "".join(line for line in lines.splitlines(keepends=True)
                           if not line.startswith("[rank"))
    first = explained_first_failure(summary_only)
    assert "rank 1 raised RuntimeError: shard 7 is corrupt: checksum mismatch, in load_shard at " \
           "/home/user/job/raise_rec.py:5" in first, first


def test_the_watchdogs_verdict_in_a_hung_jobs_log_is_its_first_failure() -> None:
    first = explained_first_failure(
        (FIXTURES / "watchdog_run_hang_killed_2_gloo.log").read_text(encoding="utf-8"))
    assert first == ("first failure: <stdin>:2: the watchdog's verdict, MISSING_RANKS: rank 1 "
                     "(stuck in read_batch at hang.py:5) never reached all_reduce #6 on group 0 "
                     "(world); rank 0 waits there since 07:46:42")


def test_a_peer_lost_is_never_the_first_failure_while_a_ranks_own_error_is_in_the_log() -> None:
    """The victim's traceback comes first in the log; the culprit's own error, later, wins."""
    victim = ("[rank0]: Traceback (most recent call last):\n"
              '[rank0]:   File "/job/train.py", line 12, in main\n'
              "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by "
              "peer [127.0.0.1]:9370\n")
    culprit = ("[rank3]: Traceback (most recent call last):\n"
               '[rank3]:   File "/job/train.py", line 40, in load\n'
               '[rank3]:   File "/usr/lib/python3.11/json/__init__.py", line 293, in load\n'
               "[rank3]: ValueError: bad header\n")
    first = explained_first_failure(victim + culprit)
    assert first == ("first failure: <stdin>:7: rank 3 raised ValueError: bad header, in load at "
                     "/job/train.py:40 (its own error: read its traceback; the other ranks' "
                     "errors follow)")
