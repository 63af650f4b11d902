"""The rule table of `watchdog explain`: which log lines mean what, and what to do about it.

Stdlib only; runs in whichever process classifies log text (the CLI, the agent). Rules are tried
in order and the first match wins, so specific causes (shared memory, GPU memory, ports) come
before the generic connection and NCCL errors that often accompany them.

What is not a finding, and why:
- NCCL INFO/TRACE lines: NCCL reports every failure at WARN level, and a log that has INFO lines
  has the WARN lines too. The `-> 6` lines after a WARN are its call trace, and "Call to connect
  returned Connection refused, retrying" is an attempt that the final WARN supersedes.
- glog I and W lines (`W1202 ...`, `[W socket.cpp:558]`): PyTorch logs failed connection
  attempts, store warnings at shutdown and torchrun's teardown at W level; the failures it acts
  on come at E level or as an exception.
- Echoes: lines that only restate a failure printed just before (the watchdog's follow-up
  lines, `ncclInternalError: Internal check failed.` after "NCCL error in: ...").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

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
    SHM,
    WATCHDOG_STUCK,
    ib_cause,
)

MAX_RANK = 1 << 20  # larger numbers after "rank" are not ranks (and must not size anything)

_RANKS_NAMED = re.compile(r"\[rank(\d+)\]|\b[Rr]anks?(?:\s*[:=]\s*|\s+)\[?(\d+(?:\s*,\s*\d+)*)")
_NUMBER = re.compile(r"\d+")


def _numbers(text: str, into: dict[int, None]) -> None:
    for number in _NUMBER.findall(text):
        if len(number) < 8 and int(number) < MAX_RANK:
            into[int(number)] = None


def ranks_named(line: str) -> tuple[int, ...]:
    """Ranks a line names: `[rank3]:`, "Rank 7", "rank : 1", "ranks [1, 2]", in order.

    A bare `[n]` is never read as a rank: in NCCL lines it is the local CUDA device, and
    `local_rank`/`nranks` do not match because `rank` must start a word.
    """
    found: dict[int, None] = {}
    for match in _RANKS_NAMED.finditer(line):
        _numbers(match.group(1) or match.group(2), found)
    return tuple(found)


def _listed(pattern: str) -> Callable[[str], tuple[int, ...]]:
    """A rank reader for reports whose ranks are group 1 of `pattern` (a number or a list)."""
    compiled = re.compile(pattern)

    def read(line: str) -> tuple[int, ...]:
        found: dict[int, None] = {}
        for match in compiled.finditer(line):
            _numbers(match.group(1), found)
        return tuple(found)

    return read


def _no_ranks(line: str) -> tuple[int, ...]:
    return ()


@dataclass(frozen=True)
class Rule:
    """One kind of line: a cheap literal test (`needles`), then `pattern` to confirm it."""

    category: str
    needles: tuple[str, ...]
    pattern: re.Pattern[str]
    ranks: Callable[[str], tuple[int, ...]] = ranks_named
    cause: str | Callable[[re.Match[str]], str] = ""  # a str may use {0}.. for the groups
    fix: str = ""

    def match(self, line: str) -> re.Match[str] | None:
        if any(needle in line for needle in self.needles):
            return self.pattern.search(line)
        return None

    def advice(self, match: re.Match[str]) -> tuple[str, str]:
        cause, fix = ADVICE[self.category]
        if callable(self.cause):
            cause = self.cause(match)
        elif self.cause:
            cause = self.cause.format(*match.groups())
        return cause, self.fix or fix


def _rule(
    category: str,
    needles: tuple[str, ...],
    pattern: str = "",
    ranks: Callable[[str], tuple[int, ...]] = ranks_named,
    cause: str | Callable[[re.Match[str]], str] = "",
    fix: str = "",
) -> Rule:
    """`pattern` defaults to "any of the needles"."""
    regex = pattern or "|".join(re.escape(needle) for needle in needles)
    return Rule(category, needles, re.compile(regex), ranks, cause, fix)


RULES: tuple[Rule, ...] = (
    _rule(SHM, ("shared memory", "/dev/shm/", "</torch_")),
    _rule(GPU_OOM, ("out of memory", "OutOfMemoryError", "CUDA calloc", "_ALLOC_FAILED")),
    _rule(PORT_IN_USE, ("ddress already in use", "EADDRINUSE")),
    _rule(
        ENV_MISSING, ("expected, but not set",),
        r"[Ee]nvironment variable (\w+) expected, but not set",
        cause="environment variable {0} is not set, and the env:// rendezvous needs it",
    ),
    _rule(
        ENV_MISSING, ("KeyError: '",),
        r"KeyError: '((?:LOCAL_|GROUP_)?RANK|(?:LOCAL_)?WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'",
        cause="the script reads environment variable {0}, which is not set",
    ),
    _rule(ENV_MISSING, ("parameter missing",), r"(?:rank|world size) parameter missing"),
    _rule(
        INVALID_RANK, ("Invalid rank",), r"Invalid rank requested",
        ranks=_listed(r"Invalid rank requested\s*:\s*(\d+)"),
        cause="a process asked for a rank that is not below the world size",
    ),
    _rule(INVALID_RANK, ("Invalid rank",), r"Invalid rank\b"),
    _rule(
        INVALID_RANK, ("Duplicate GPU detected",),
        cause="two ranks use the same GPU: the processes did not call "
        "torch.cuda.set_device(LOCAL_RANK), or all see the same CUDA_VISIBLE_DEVICES",
        fix=ONE_GPU_PER_RANK_FIX,
    ),
    _rule(
        INVALID_RANK, ("invalid device ordinal",),
        cause="a process selected a GPU that does not exist: LOCAL_RANK is at least the number "
        "of visible GPUs (more processes per node than GPUs, or CUDA_VISIBLE_DEVICES hides some)",
    ),
    _rule(
        DESYNC, ("are the lagging ranks",), ranks=_listed(r"ranks \[([\d,\s]*)\] are the lagging"),
        cause="the ranks named never joined any collective of this process group",
    ),
    _rule(
        DESYNC, ("joined but didn't finish", "but didn't join collective"),
        ranks=_listed(r"\[([\d,\s]+)\] (?:joined but didn't finish|finished collective #\d+, but)"),
    ),
    _rule(
        DESYNC, ("monitoredBarrier",), r"failed to pass monitoredBarrier",
        ranks=_listed(r"Ranks? ([\d,\s]+?) failed to pass monitoredBarrier"),
        cause="the ranks named did not reach dist.monitored_barrier() in time",
    ),
    _rule(
        DESYNC, ("monitoredBarrier",), r"successfully reached monitoredBarrier", ranks=_no_ranks,
        cause="this rank reached the monitored barrier; rank 0 waited for the others and its log "
        "names the ranks that did not arrive",
        fix="read rank 0's log for 'failed to pass monitoredBarrier': it names the lagging ranks",
    ),
    _rule(
        DESYNC, ("mismatch between collectives",), ranks=_listed(r"Rank (\d+) is running"),
        cause="the ranks named called different collectives (or shapes) at the same point",
    ),
    # Mistakes in the training code that PyTorch rejects, with its messages (torch 2.13).
    _rule(
        API_MISUSE, ("sampler option is mutually exclusive with",),
        cause="the DataLoader was given a sampler (a DistributedSampler) and shuffle=True (or a "
        "batch_sampler with batch_size, shuffle or drop_last): the sampler decides the order, so "
        "DataLoader refuses both",
        fix="drop shuffle=True from the DataLoader and let the sampler shuffle: "
        "DistributedSampler(dataset, shuffle=True), with sampler.set_epoch(epoch) at the start "
        "of every epoch (else every epoch has the same order); a batch_sampler takes batch_size "
        "and drop_last itself",
    ),
    _rule(
        API_MISUSE, ("Default process group has not been initialized",),
        cause="torch.distributed was used (a collective, get_rank, DistributedSampler without "
        "num_replicas and rank, DDP) before init_process_group, or in a process that never "
        "calls it",
        fix="call dist.init_process_group(backend) first in every process, before building the "
        "sampler or the DDP model; code that also runs in one process checks "
        "dist.is_initialized()",
    ),
    _rule(
        API_MISUSE, ("initialize the default process group twice",),
        cause="init_process_group was called a second time in the same process (by the script "
        "and a library or launcher helper, or again on a retry)",
        fix="initialise once, guarded by `if not dist.is_initialized()`; call "
        "dist.destroy_process_group() before initialising again",
    ),
    _rule(
        API_MISUSE, ("device_ids and output_device arguments only work",
                     "device_ids can only be None or contain a single element"),
        cause="DistributedDataParallel was given device_ids that do not fit the module: the model "
        "is still on the CPU (or spread over several GPUs) when it is wrapped, or several "
        "device_ids were given",
        fix="one process per GPU: torch.cuda.set_device(local_rank), model.to(local_rank), then "
        "DDP(model, device_ids=[local_rank]); a CPU or multi-GPU module takes no device_ids",
    ),
    _rule(
        API_MISUSE, ("input module must be on the same type of devices",),
        cause="part of the model is on the CPU and part on a GPU when DistributedDataParallel "
        "wraps it",
        fix="move the whole model to the rank's device (model.to(local_rank)) before wrapping it",
    ),
    _rule(
        API_MISUSE, ("doesn't have any parameter that requires a gradient",),
        cause="DistributedDataParallel wrapped a module with no trainable parameter: all are "
        "frozen (requires_grad=False), or they are plain tensors not registered as nn.Parameter",
        fix="wrap the module that trains; a frozen one (a teacher, a reference model) needs no "
        "DDP; register parameters as nn.Parameter and submodules in nn.ModuleList",
    ),
    _rule(
        API_MISUSE, ("Expected to have finished reduction in the prior iteration",),
        cause="some parameters of the DDP model got no gradient in the previous iteration (not "
        "used in the loss: a branch not taken, an unused head, a forward output left out of "
        "the loss), so DDP's gradient reduction never finished",
        fix="pass find_unused_parameters=True to DistributedDataParallel (it costs a graph walk "
        "each iteration), or make every parameter take part in the loss; "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL names the parameters",
    ),
    _rule(
        API_MISUSE, ("Expected to mark a variable ready only once",),
        cause="a parameter's gradient was ready twice in one iteration: the same layers are "
        "wrapped by several reentrant activation checkpoints, or used outside forward",
        fix="use torch.utils.checkpoint.checkpoint(..., use_reentrant=False), or "
        "DDP(..., static_graph=True) when the graph is the same every iteration; do not use a "
        "DDP model's parameters outside its forward",
    ),
    _rule(
        API_MISUSE, ("DDP expects same model across all ranks",
                     "appears not to match sizes of the same param in process"),
        cause="the ranks built different models (a different number of parameters, or other "
        "shapes): a per-rank configuration, another checkpoint, or layers created only on some "
        "ranks",
        fix="build the model identically on every rank (same configuration and arguments), and "
        "load a checkpoint into it before wrapping it in DDP, on every rank alike",
    ),
    _rule(
        API_MISUSE, ("No backend type associated with device type",),
        r"No backend type associated with device type (\w+)",
        cause="a collective was given a {0} tensor, and the process group has no backend for "
        "that device: CPU tensors under backend='nccl', or CUDA tensors in a CPU-only group",
        fix="move the tensors to the rank's GPU for NCCL (tensor.to(local_rank) after "
        "torch.cuda.set_device(local_rank)), or give each device type a backend: "
        "init_process_group('cpu:gloo,cuda:nccl')",
    ),
    _rule(
        WATCHDOG_STUCK,
        ("Heartbeat monitor timed out", "watchdog got stuck", "no heartbeat of its watchdog"),
    ),
    _rule(
        COLLECTIVE_TIMEOUT, ("collective operation timeout", "operation to complete"),
        r"collective operation timeout|Timed out waiting \d+ms for \w+ operation to complete",
    ),
    _rule(
        RENDEZVOUS, ("clients joined",), r"(\d+)/(\d+) clients joined",
        cause="only {0} of {1} processes reached the store in time: the others never started, "
        "crashed before init_process_group, or use another MASTER_ADDR/MASTER_PORT",
    ),
    _rule(
        RENDEZVOUS, ("has already checked in",), r"rank (\d+) of \d+ ranks has already checked in",
        cause="two processes claimed rank {0}: a stale process of an earlier run, a second job on "
        "the same rendezvous endpoint, or a wrong RANK",
    ),
    _rule(
        RENDEZVOUS, ("wait timeout after",),
        cause="waited for a store key that another rank never wrote: that rank did not reach the "
        "same process-group setup (init_process_group, new_group or the first collective)",
    ),
    _rule(
        RENDEZVOUS, ("Rendezvous", "store based barrier", "mismatch in rank count"),
        r"Rendezvous(?:Timeout|Closed|Connection|State)?Error|store based barrier"
        r"|mismatch in rank count",
    ),
    _rule(
        # ibverbs failures come as NCCL WARN lines; " NCCL WARN " keeps the scan's needles long
        IB_ERROR, ("NET/IB :", "NET/IB: ", "Got completion from peer", " NCCL WARN "),
        r"NET/IB[^:\s]* ?:.*?with (?:error |status=(?:\w+\()?)(\d+)|NET/IB[^:\s]* ?:|ibv_",
        cause=ib_cause,
    ),
    _rule(
        PEER_EXITED,
        ("closed by remote peer", "closed by peer", "reset by peer", "remote process exited"),
    ),
    _rule(PEER_EXITED, ("Broken pipe",)),
    _rule(
        PEER_EXITED, ("to recv, got 0 bytes",),
        cause="the connection to the c10d store closed: the process hosting it (rank 0, or the "
        "torchrun agent) exited",
    ),
    _rule(
        CONNECT_FAILED, ("interface found", "listening interface"),
        cause="NCCL found no usable network interface",
        fix="set NCCL_SOCKET_IFNAME to the interface that connects the nodes (see `ip addr`)",
    ),
    _rule(
        CONNECT_FAILED,
        ("socketStartConnect", "socketPollConnect", "Connect to ", "Connect timeout",
         "Connection refused", "Connection timed out", "No route to host", "Network is unreachable",
         "client socket has", "TCP client failed", "connectFullMesh failed"),
        r"socket(?:Start|Poll)Connect|Connect to \S+ failed|Connect timeout|Connection refused"
        r"|Connection timed out|No route to host|Network is unreachable|TCP client failed to"
        r"|client socket has (?:timed out|failed to connect)|connectFullMesh failed",
    ),
    _rule(
        NCCL_ERROR, ("NCCL error", "NCCL Error", "unhandled system error", "unhandled cuda error"),
    ),
    _rule(
        NCCL_ERROR, (" NCCL WARN ",), cause="NCCL printed a warning that it does not recover from",
    ),
)

SUMMARY_HEADS = ("Failures:", "Root Cause (first observed failure)")


def _cover(needles: list[str]) -> tuple[str, ...]:
    """The needles that contain no other needle: a line has one of these if it has any."""
    unique = list(dict.fromkeys(needles))
    return tuple(n for n in unique if not any(o != n and o in n for o in unique))


# what makes a line worth a closer look, for the fast scan over many lines at once
NEEDLES = _cover([needle for rule in RULES for needle in rule.needles] + list(SUMMARY_HEADS))

_PREFIX = re.compile(
    r"""\s*(?:
        \[[A-Za-z_]*\d+\]:                                        # [rank3]:, torchrun's [default3]:
      | \[?\d{4}-\d\d-\d\d[T\s][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\]?   # date-time stamps
      | \[?(?P<level>[IWEF])(?:\d{3,4}\s+[\d:.]+\s+(?:\d+\s+)?|\s*)[\w./\\-]+:\d+\]  # glog
    )""",
    re.X,
)


def split_prefix(line: str) -> tuple[str, str]:
    """(glog level letter or "", the message without rank, time and glog prefixes)."""
    level, at = "", 0
    while match := _PREFIX.match(line, at):
        level, at = match.group("level") or level, match.end()
    return level, line[at:]


_ECHOES = (
    "retrying",  # an attempt; the failure that ends the retries is printed on its own
    "detected by watchdog at work",
    "Timeout at NCCL work",
    "watchdog thread terminated with exception",
    "communicator was aborted",
    "Received a dump signal",
    "Some NCCL operations have failed or timed out",
)
# A traceback shows each frame's source line: `raise ValueError("...")` restates the error.
_ECHO_START = re.compile(r"nccl[A-Z]\w*(?:Error|Usage|Argument)\b: |frame #\d+: |File \"|raise ")


def is_benign(line: str, level: str, message: str) -> bool:
    """True for lines that must never be findings (see the module docstring)."""
    if " NCCL INFO " in line or " NCCL TRACE " in line or level in ("I", "W"):
        return True
    return any(echo in message for echo in _ECHOES) or bool(_ECHO_START.match(message.lstrip()))
