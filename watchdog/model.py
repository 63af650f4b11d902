"""Plain data shared by the agent and the coordinator (never imported by the hook).

These dataclasses, and the closed sets of names below, are what the rest of the code sees;
`transport.wire` alone converts them to and from protobuf messages. `Pace`, `Fingerprint` and
`Environment` are the hook's own records (`watchdog.beacon.records`), which a report carries
unchanged.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Imported "as" themselves: re-exported, for the code that sees only this module (the op is
# the one the hook records for DDP's constructor, which the coordinator words).
from watchdog.beacon.records import NO_PACE as NO_PACE
from watchdog.beacon.records import Environment as Environment
from watchdog.beacon.records import Fingerprint as Fingerprint
from watchdog.beacon.records import Pace as Pace
from watchdog.collectives import DDP_INIT_OP as DDP_INIT_OP
from watchdog.frames import TRUNCATED_FILE, is_native_file
from watchdog.text import bounded_escaped

WORLD_GROUP = "0"  # c10d names the default process group "0"


class _Text(str, enum.Enum):
    """A closed set of names that reach JSON and terminals as plain strings."""

    def __str__(self) -> str:
        return str(self.value)


class Kind(_Text):
    """The closed set of verdict and finding kinds (docs/design.md)."""

    MISSING_RANKS = "MISSING_RANKS"
    COLLECTIVE_MISMATCH = "COLLECTIVE_MISMATCH"
    RANK_EXITED = "RANK_EXITED"
    RANK_WEDGED = "RANK_WEDGED"
    ALL_IN_COLLECTIVE = "ALL_IN_COLLECTIVE"
    RANK_STALLED = "RANK_STALLED"
    NODE_UNREACHABLE = "NODE_UNREACHABLE"
    RANK_BUSY = "RANK_BUSY"
    # Findings: the job runs, but silently wrong.
    REPLICA_DESYNC = "REPLICA_DESYNC"
    NO_GRAD_SYNC = "NO_GRAD_SYNC"
    DUPLICATE_DATA = "DUPLICATE_DATA"
    SAMPLER_EPOCH_REUSED = "SAMPLER_EPOCH_REUSED"
    DDP_MODULE_CHANGED = "DDP_MODULE_CHANGED"
    NONFINITE_LOSS = "NONFINITE_LOSS"
    ENV_MISMATCH = "ENV_MISMATCH"
    SHARED_DEVICE = "SHARED_DEVICE"
    # A notice beside the job: ranks the others persistently wait for.
    STRAGGLER = "STRAGGLER"

    @property
    def severity(self) -> Severity:
        if self in (Kind.RANK_BUSY, Kind.STRAGGLER):
            return Severity.NOTICE
        return Severity.WARNING if self in FINDINGS else Severity.HANG

    @property
    def check(self) -> str:
        """The name of the hook's check behind a finding (`WATCHDOG_CHECKS`)."""
        return self.value.lower()


class Severity(_Text):
    """How much an incident matters: only a hang ends a job (`--on-hang kill`)."""

    HANG = "hang"
    NOTICE = "notice"  # a rank works while its peers wait: a long phase, until --busy-timeout
    WARNING = "warning"  # the job runs, but something is silently wrong


# The findings, in the order of the hook's checks (beacon.CHECK_NAMES; bits of a mask on the wire).
CHECK_KINDS = (Kind.REPLICA_DESYNC, Kind.NO_GRAD_SYNC, Kind.DUPLICATE_DATA,
               Kind.SAMPLER_EPOCH_REUSED, Kind.DDP_MODULE_CHANGED, Kind.NONFINITE_LOSS)
# ...and the findings the coordinator makes of what every hook records at start, with no check.
FINDINGS = frozenset({*CHECK_KINDS, Kind.ENV_MISMATCH, Kind.SHARED_DEVICE})


class JobState(_Text):
    """A job's state in `watchdog status`."""

    RUNNING = "RUNNING"
    STALLED = "STALLED"  # no progress past the threshold; no verdict yet
    HUNG = "HUNG"  # a hang incident is open
    FINISHED = "FINISHED"  # every rank exited 0 after a clean shutdown, with no incident
    FAILED = "FAILED"


class RankStatus(_Text):
    """One rank's state in an incident's and in `watchdog status`'s per-rank table."""

    RUNNING = "RUNNING"
    WAITING = "WAITING"  # pending in a collective
    BUSY = "BUSY"  # the job is stalled, and this rank works outside any collective
    STALLED = "STALLED"  # the job is stalled and this rank waits in no collective
    STOPPED = "STOPPED"  # state T: someone stopped the process
    WEDGED = "WEDGED"  # D state, or its main thread has not run for a while
    EXITED = "EXITED"
    FINISHED = "FINISHED"  # exited 0 after a clean interpreter shutdown


# GroupProgress and RankState arrive 16k a second at scale: slotted and not frozen, since a frozen
# dataclass's __init__ cost 3.7 us more per rank state (a fifth of decoding one). Nothing
# mutates them after `transport.wire` builds them.
@dataclass(slots=True)
class GroupProgress:
    """One rank's view of one process group: the last collective it entered and completed."""

    group: str
    ranks: tuple[int, ...]  # global ranks of the members; empty when unknown
    entered_seq: int
    entered_op: str
    completed_seq: int
    entered_at: float  # unix seconds

    @property
    def pending(self) -> bool:
        return self.entered_seq > self.completed_seq


@dataclass(frozen=True, slots=True)
class Activity:
    """What a rank's process did over the agent's last few seconds, from /proc and NVML: the
    evidence that tells a busy rank from a hung one without stopping it."""

    window: float = 0.0  # seconds the rates cover; 0: not known yet
    main_cpu: float = 0.0  # cores used by the main thread
    process_cpu: float = 0.0  # cores used by the whole process
    read_rate: float = 0.0  # bytes/s read (files, pipes, sockets)
    write_rate: float = 0.0  # bytes/s written
    gpu_util: float | None = None  # percent of the GPU's SMs busy with it; None: unknown
    # Share of the window the main thread was runnable, waiting for a CPU: the kernel's run
    # delay, or where larger the share of readings that found it runnable less its CPU use.
    main_wait: float = 0.0


NO_ACTIVITY = Activity()


@dataclass(frozen=True, slots=True)
class CheckEvidence:
    """What a rank's silent-bug checks gathered; the coordinator's findings compare ranks. The
    agent makes it of the beacon's `CheckState` (see there why the two differ)."""

    checks: tuple[str, ...] = ()  # the checks the rank's hook runs (Kind.check names)
    fingerprints: tuple[Fingerprint, ...] = ()  # the latest, while new: sent a few times
    unsynced_steps: int = 0  # optimizer steps, while no gradient collective was ever seen
    sampler_reuses: int = 0  # shuffling DistributedSampler iterations that repeated an epoch
    sampler_reuse_step: int = 0  # the step of the first, and its epoch
    sampler_epoch: int = 0
    ddp_change_step: int = 0  # when a DDP module's parameters were first seen changed; 0: no
    ddp_change_module: int = 0
    ddp_change_group: str = ""
    ddp_change: str = ""  # what changed
    nonfinite_step: int = -1  # the step of the first loss found NaN or infinite; -1: none
    nonfinite_value: float = 0.0  # ...that loss


NO_EVIDENCE = CheckEvidence()


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def native(self) -> bool:
        """A C/C++ frame that `py-spy --native` interleaves with the Python ones."""
        return is_native_file(self.file)


MAX_LINE = (1 << 31) - 1  # a frame's line number as the wire carries it (int32)


def bounded_frames(frames: Sequence[Frame], limit: int,
                   total: int | None = None) -> tuple[Frame, ...]:
    """`frames` (innermost first; the first of `total` where more were taken) with their names
    cut and their controls escaped (`text.bounded_escaped`), their line numbers in range, at
    most `limit` of them: past it, the innermost `limit - 1` and a last one that says how many
    outer frames are not shown. Where a rank is stuck is innermost; a deep recursion then costs
    its outer frames, never the whole stack."""
    total = len(frames) if total is None else total
    cut = total > limit
    kept = [Frame(bounded_escaped(f.function), bounded_escaped(f.file),
                  max(-MAX_LINE, min(f.line, MAX_LINE)))
            for f in frames[:limit - 1 if cut else limit]]
    if cut:
        kept.append(Frame(f"…[{total - len(kept)} outer frames not shown]", TRUNCATED_FILE, 0))
    return tuple(kept)


@dataclass(frozen=True)
class ExitReason:
    """Why a rank's process ended, where it is known: the exception it raised (type, message,
    frames innermost first, as the hook recorded them), or the signal that killed it."""

    exception: str = ""  # the exception's type, e.g. RuntimeError
    message: str = ""
    frames: tuple[Frame, ...] = ()
    signal: str = ""  # e.g. SIGKILL
    # The kernel's OOM killer sent that signal; with an exception: it killed a process of the
    # rank's memory cgroup meanwhile (its DataLoader worker, where the exception names one).
    oom_killed: bool = False


@dataclass(frozen=True)
class ChildStack:
    """A child process of a rank whose main thread waits on it (a DataLoader worker above all):
    its main thread's stack, innermost first, and what shows whether it works."""

    pid: int
    role: str = ""  # DATALOADER_WORKER, or "" for another child process
    worker_id: int | None = None  # a DataLoader worker's, where py-spy read it
    state: str = ""  # its /proc state letter when sampled
    frames: tuple[Frame, ...] = ()
    error: str = ""  # why no stack could be taken
    moved: bool = False  # its innermost Python frame differed between samples
    cpu: float = 0.0  # cores it used while it was sampled


DATALOADER_WORKER = "dataloader_worker"


@dataclass(frozen=True)
class RankStack:
    """The main thread's stack of one rank, innermost frame first (py-spy order)."""

    rank: int
    pid: int
    frames: tuple[Frame, ...] = ()
    error: str = ""  # why no stack could be taken
    was_stopped: bool = False  # someone else had stopped the process (state T) before the dump
    nccl_log: tuple[str, ...] = ()  # the relevant tail of the rank's NCCL_DEBUG_FILE
    worker_log: tuple[str, ...] = ()  # ...and of the files its stdout and stderr go to
    samples: int = 1  # stacks taken, spread over about a second; `frames` is the last one
    moved: bool = False  # their innermost Python frames differed: the rank runs Python
    children: tuple[ChildStack, ...] = ()  # the child processes its main thread waits on


@dataclass(slots=True)
class RankState:
    """What an agent knows about one training process; one per rank in a node report."""

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    hooked: bool  # False: found in /proc without a beacon (stacks-only mode)
    proc_state: str  # /proc state letter (R, S, D, T, t, Z) or "" once exited
    heartbeat_age: float | None  # seconds since the hook's liveness thread last ran
    steps: int
    events: int  # monotonic count of everything the hook recorded
    last_event_at: float  # unix seconds of the latest recorded event, 0 if none
    groups: tuple[GroupProgress, ...] = ()
    phase: str = ""
    phase_age: float = 0.0
    phase_timeout: float = 0.0
    exited_at: float | None = None
    exit_code: int | None = None  # None while alive, or when the process was killed
    clean_exit: bool = False  # the interpreter shut down normally (the hook's atexit ran)
    progress_age: float | None = None  # seconds since the hook saw its event count change
    pace: Pace = NO_PACE  # the hook's own gaps between progress, from its first step
    # seconds since the compile under way (torch.compile) began, by the agent's clock; None: none
    compile_age: float | None = None
    activity: Activity = NO_ACTIVITY
    exit_reason: ExitReason | None = None  # once exited, where known
    attempt: int = 0  # torchrun's restart count: each attempt is a job of its own
    setup: str = ""  # the process-group set-up call it waits in (init_process_group, new_group)
    setup_age: float | None = None  # for how long, by the agent's clock
    rendezvous: str = ""  # where the members of that call meet (tcp://..., env://HOST:PORT)
    evidence: CheckEvidence = NO_EVIDENCE
    environment: Environment | None = None  # in the few reports after the hook recorded it
    waited: float = 0.0  # seconds spent inside collectives in all, by the rank's own clock
    waited_sq: float = 0.0  # the sum of each step's seconds there, squared
    uid: int | None = None  # the verified process's user, where the agent knows it

    @property
    def alive(self) -> bool:
        return self.exited_at is None

    def group(self, name: str) -> GroupProgress | None:
        for progress in self.groups:
            if progress.group == name:
                return progress
        return None


@dataclass(frozen=True)
class NodeReport:
    node: str
    sent_at: float
    ranks: tuple[RankState, ...]


# Up to this many ranks, an incident and status list every rank in full: what any small job shows.
FULL_ROWS = 256
# Above, they list at most this many ranks in full (culprits first, then
# ranks a reader asked for, then ranks with evidence of their own); the rest are grouped.
MAX_FULL_ROWS = 1024


@dataclass(frozen=True)
class StatusQuery:
    """What `watchdog status` asks: one job ("" for every one) and ranks to list in full."""

    job_id: str = ""
    ranks: tuple[int, ...] = ()


EVERY_JOB = StatusQuery()


@dataclass(frozen=True)
class StackRequest:
    request_id: int
    job_id: str
    ranks: tuple[int, ...]
    samples: int = 1  # stacks of each rank, spread over about a second


@dataclass(frozen=True)
class StackReply:
    request_id: int
    node: str
    stacks: tuple[RankStack, ...]


@dataclass(frozen=True)
class CollectiveRef:
    group: str
    ranks: tuple[int, ...]
    seq: int
    op: str


@dataclass(frozen=True)
class Advice:
    """What a `watchdog explain` category says a verdict's cause is, and how to fix it."""

    category: str
    cause: str
    fix: str


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    summary: str
    culprit_ranks: tuple[int, ...]
    waiting_ranks: tuple[int, ...]
    collective: CollectiveRef | None = None
    node: str = ""  # set for NODE_UNREACHABLE
    advice: Advice | None = None  # where the cause is a known one (a rendezvous failure, ...)

    @property
    def severity(self) -> Severity:
        return self.kind.severity


@dataclass(frozen=True)
class JobSnapshot:
    """Everything the verdict engine looks at for one job, at one instant."""

    job_id: str
    world_size: int
    now: float
    stalled_for: float  # seconds without progress from any rank
    stalled: bool  # stalled_for passed the job's threshold
    ranks: tuple[RankState, ...]
    stacks: dict[int, RankStack] = field(default_factory=dict)
    rank_nodes: dict[int, str] = field(default_factory=dict)  # the agent that reports each rank
    unreachable_nodes: tuple[str, ...] = ()  # nodes whose agent stopped reporting
    busy_timeout: float = float("inf")  # a rank busy this long while its peers wait is hung
    # rank -> the processes (host, pid) that claim it, where more than one does
    duplicates: dict[int, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    # What the coordinator reads out of this snapshot, kept with it: the verdict and the
    # incident's table ask the same 131,072 ranks the same questions (`view.rank_evidence`).
    # Not an init field: `dataclasses.replace` gives the copy a cache of its own.
    derived: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def attempt(self) -> int:
        """Which of the launcher's attempts the job is: torchrun's restart count, 0 first."""
        return max((r.attempt for r in self.ranks), default=0)
