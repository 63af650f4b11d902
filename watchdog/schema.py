"""The JSON the watchdog hands out, typed (stdlib only): an incident and its parts, and a job of
`watchdog status --json`, as docs/design.md's contracts spell them. The coordinator builds them
(`coordinator/incident.py`); the store keeps their text, and the supervisor, the terminal, the
pages and the webhooks read them by these keys, so that mypy sees a renamed key everywhere.

A key only some incidents carry is `NotRequired`. Incidents of older releases, read back from a
database, may lack more: the reports read them with `.get` and a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # typing.NotRequired is Python 3.11's; annotations stay strings at run time
    from typing import NotRequired


class Frame(TypedDict):
    """One frame of a stack, innermost first in its list."""

    function: str
    file: str
    line: int


class Collective(TypedDict):
    """The collective a verdict names: seq 0 and op `init_process_group` or `new_group` for a
    set-up call."""

    group: str
    ranks: list[int]
    seq: int
    op: str


class Advice(TypedDict):
    """What `watchdog explain` says of a verdict's cause: its category, the cause, the fix."""

    category: str
    cause: str
    fix: str


class Finding(TypedDict):
    """A silent bug's own keys in its incident (severity warning)."""

    key: str  # what it is about: reported once per job
    step: int  # the first step it was seen at
    cause: str
    fix: str


class LogFinding(TypedDict):
    """A log line `watchdog explain` recognises (`explain --json` prints a list of them)."""

    line_no: int
    text: str
    category: str
    ranks: list[int]
    cause: str
    fix: str


class RaisedException(TypedDict):
    type: str
    message: str
    frames: list[Frame]


class ExitReason(TypedDict, total=False):
    """How a rank ended: `{"exception": ...}`, or `{"signal": "SIGKILL"}` with `oom_killed`
    where the OOM killer sent it."""

    exception: RaisedException
    signal: str
    oom_killed: bool


class LastCollective(TypedDict):
    group: str
    seq: int
    op: str
    completed: bool


class TimelineCollective(LastCollective):
    entered_at: float


class Timeline(TypedDict):
    """What the HTML report draws of a rank: its last event, its exit, and the last collective
    of each of its groups (the 8 entered last)."""

    last_event_at: float | None
    exited_at: float | None
    collectives: list[TimelineCollective]


class Activity(TypedDict):
    """The /proc (and NVML) evidence behind BUSY and STALLED."""

    window: float
    main_cpu: float
    process_cpu: float
    read_rate: int
    write_rate: int
    gpu_util: float | None
    main_wait: float


class Child(TypedDict):
    """A child process the rank's main thread waits on (a DataLoader worker)."""

    pid: int
    role: str | None
    worker_id: int | None
    state: str
    stack: list[Frame]
    error: str
    moved: bool
    cpu: float
    exit_code: int | None
    exit_reason: ExitReason | None


class RankRow(TypedDict):
    """One rank in full, in an incident or a status job."""

    rank: int
    host: str
    node: str
    pid: int
    state: str
    step: int
    last_collective: LastCollective | None
    setup: str | None
    stack: list[Frame]
    children: list[Child]
    nccl_log: list[str]
    nccl_findings: list[LogFinding]
    worker_log: list[str]
    worker_findings: list[LogFinding]
    exit_code: int | None
    exit_reason: ExitReason | None
    heartbeat_age: float | None
    phase: str
    activity: Activity | None
    timeline: Timeline


class RankGroup(TypedDict):
    """Ranks alike, as inclusive [first, last] ranges, and what they share."""

    ranks: list[list[int]]
    count: int
    state: str
    step: int
    last_collective: LastCollective | None
    setup: str | None
    phase: str
    exit_code: int | None
    stack: list[Frame]
    hosts: int


class RankTable(TypedDict):
    """`ranks` and `rank_groups`: every rank in full up to 256, else culprits and outliers in
    full and the others in groups alike."""

    ranks: list[RankRow]
    rank_groups: list[RankGroup]


class StackGroup(TypedDict):
    """Ranks with the same stack, and its top frame ('all_reduce (distributed_c10d.py:2950)')."""

    ranks: list[int]
    top: str


class Incident(TypedDict):
    id: str
    job_id: str
    detected_at: float
    kind: str
    severity: str  # hang, notice or warning
    summary: str
    culprit_ranks: list[int]
    waiting_ranks: list[int]
    collective: Collective | None
    advice: NotRequired[Advice | None]  # not in a finding's incident
    attempt: NotRequired[int]  # ...nor this
    ranks: list[RankRow]
    rank_groups: list[RankGroup]
    stack_groups: list[StackGroup]
    node: NotRequired[str]  # NODE_UNREACHABLE's
    finding: NotRequired[Finding]  # a finding's
    ended_at: NotRequired[float]  # a notice whose rank moved on
    resumed_at: NotRequired[float]  # a hang the job contradicted


class Flagged(TypedDict):
    """A rank a job does not trust (another world size, a rank another process holds)."""

    rank: int
    node: str
    host: str
    pid: int
    world_size: int
    reason: str


class SlowestRank(TypedDict):
    """The rank the others wait for most, whether or not it is called a straggler yet."""

    rank: int
    host: str
    lost_per_step: float  # seconds the others wait for it per step
    share: float  # of each step
    straggler: bool  # held the job back long enough to be called (a STRAGGLER notice)


class StatusJob(TypedDict):
    job_id: str
    attempt: int
    state: str  # RUNNING, STALLED, HUNG, FINISHED or FAILED
    world_size: int
    nodes: list[str]
    ranks: list[RankRow]
    rank_groups: list[RankGroup]
    verdict: Incident | None
    findings: list[Incident]
    flagged: list[Flagged]
    slowest: SlowestRank | None


class Status(TypedDict):
    jobs: list[StatusJob]


def is_hang(incident: Mapping[str, object]) -> bool:
    """Severity hang (RANK_EXITED included); an incident without a severity is one."""
    return incident.get("severity", "hang") == "hang"
