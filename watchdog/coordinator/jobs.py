"""The coordinator's view of one job, joined from every node's reports (coordinator process):
its ranks' latest states, running totals of them, and the stall clock. What happened to the
job's progress is returned (`observe`); what to make of it is the job's `Judgement`'s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from watchdog.coordinator.evidence import in_open_phase, progress_sign
from watchdog.coordinator.silent_bugs import FindingTracker
from watchdog.coordinator.stall import ProgressTracker, StallPolicy
from watchdog.coordinator.straggler import Slowest, StragglerTracker
from watchdog.frames import python_frames
from watchdog.model import Frame, GroupProgress, JobSnapshot, RankStack, RankState

WARM_EVENTS = 8
MAX_DUPLICATES = 1024
PACED_STEPS = 3  # a hook's own gaps count once its rank finished this many steps
# A quiet spell is looked at, to tell a phase from training, once the agents' activity rates
# can fit inside it (a rank's rates run from its last progress once they span half a second:
# agent/activity.py), and then at most once a second: a 2 s evaluation is a phase too, and any
# spell long enough to raise the threshold above the floor (floor / k: 2 s) gets looked at.
PHASE_LOOK_AFTER_S = 1.5
PHASE_LOOK_EVERY_S = 1.0


_NO_PART = (0, False, False, False, False)


@dataclass(frozen=True)
class Progress:
    """What one `JobView.observe` found: when the quiet spell it looked at began (the job's
    last progress before it; the time of the look before any), and, where progress ended that
    spell, how many seconds it lasted."""

    quiet_since: float
    resumed_after: float | None = None


def _any_pending(groups: tuple[GroupProgress, ...]) -> bool:
    for progress in groups:  # noqa: SIM110 (a generator per rank, 131,072 ranks a second)
        if progress.pending:
            return True
    return False


@dataclass
class JobView:
    job_id: str
    policy: StallPolicy
    ranks: dict[int, RankState] = field(default_factory=dict)
    nodes: dict[int, str] = field(default_factory=dict)
    # Stacks-only jobs (no hook) progress when their stacks change between two looks.
    stack_probe: dict[int, tuple[Frame, ...]] = field(default_factory=dict)
    probe_progress: int = 0
    # Silent bugs: warnings in their own state, so they never hide a hang nor wait for one.
    findings: FindingTracker = field(default_factory=FindingTracker)
    # Who the others wait for (a STRAGGLER notice), and the slowest rank as last measured.
    stragglers: StragglerTracker = field(default_factory=StragglerTracker)
    slowest: Slowest | None = None

    def __post_init__(self) -> None:
        self.tracker = ProgressTracker(self.policy)
        # Running totals, kept up to date on each update: the coordinator reads them every tick,
        # and at 16k ranks scanning every rank per read was a sixth of its CPU.
        self.world_size = 0
        self._events = 0
        self._hooked = 0
        self._exited = 0
        self._warming = 0
        self._waiting = 0
        self._parts: dict[int, tuple[int, bool, bool, bool, bool]] = {}  # each rank's, by `_count`
        self._in_phase: set[int] = set()
        # rank -> the live processes (host, pid) that claimed it besides the one followed: a
        # duplicate RANK (the rendezvous then never completes)
        self.duplicates: dict[int, set[tuple[str, int]]] = {}
        self._started = False
        self._progress_at: float | None = None  # the latest progress any hook stamped
        self._undated = False  # a change since the last `observe` that no hook stamped
        self._paces: dict[int, float] = {}  # rank -> its hook's p99 gap, once paced
        self._pace: float | None = None  # their maximum; None until recomputed
        # Whether the current quiet spell is a phase, not training (`_quiet_is_phase`), and
        # when it was last looked at.
        self._phase_gap = False
        self._phase_looked = 0.0
        self._gone_at: dict[int, float] = {}  # rank -> when a report first showed it exited

    def update(self, node: str, state: RankState, received: float | None = None) -> None:
        """Take a rank's state from a report that arrived at `received` (None: unknown). A
        second live process claiming a rank is noted, not followed."""
        previous = self.ranks.get(state.rank)
        if previous is not None and previous.alive and (
                previous.pid != state.pid or previous.host != state.host):
            if state.alive and len(self.duplicates) < MAX_DUPLICATES:
                self.duplicates.setdefault(state.rank, set()).add((state.host, state.pid))
            return
        self.duplicates.pop(state.rank, None)
        self._note_gone(previous, state, received)
        fresh = state.rank not in self._parts
        moved = self._count(state)
        self.world_size = max(self.world_size, state.world_size)
        self.ranks[state.rank] = state
        self.nodes[state.rank] = node
        self.findings.observe(state)
        if received is not None:
            self.stragglers.observe(state, received)
        undated = True  # a change no hook dated is dated by its arrival
        if received is not None and state.progress_age is not None:
            undated = fresh  # a rank starting is progress, whenever its hook last stamped any
            at = received - state.progress_age  # the agent measured the age on its own clock
            self._progress_at = at if self._progress_at is None else max(self._progress_at, at)
        self._undated = self._undated or (moved and undated)
        pace = state.pace
        paced = state.hooked and state.steps >= PACED_STEPS and pace.gaps > 0
        if self._paces.get(state.rank) != (pace.gap_p99 if paced else None):
            if paced:
                self._paces[state.rank] = pace.gap_p99
            else:
                self._paces.pop(state.rank, None)
            self._pace = None

    def _note_gone(self, previous: RankState | None, state: RankState,
                   received: float | None) -> None:
        if state.exited_at is None:
            self._gone_at.pop(state.rank, None)  # a launcher's restart reuses the rank
        elif previous is None or previous.alive:
            self._gone_at[state.rank] = (state.exited_at if received is None
                                         else max(state.exited_at, received))

    def gone_at(self, rank: int) -> float | None:
        """When the rank's process was known gone: the first report that showed it exited,
        else its exit time. The hook times an exit at sys.exit, before exit handlers that may
        take seconds; its launcher sees the exit only once the process is gone."""
        state = self.ranks.get(rank)
        if state is None or state.exited_at is None:
            return None
        return self._gone_at.get(rank, state.exited_at)

    @property
    def hook_p99(self) -> float | None:
        """The slowest paced rank's own p99 gap between progress; None before any is paced."""
        if self._pace is None and self._paces:
            self._pace = max(self._paces.values())
        return self._pace

    def _count(self, state: RankState) -> bool:
        """Put the rank's part in the running totals, in place of its previous state's; whether
        its event count changed."""
        alive, hooked = state.exited_at is None, state.hooked
        part = (state.events, hooked, not alive,
                hooked and state.steps == 0 and state.events < WARM_EVENTS,
                alive and (bool(state.setup) or _any_pending(state.groups)))
        old = self._parts.get(state.rank, _NO_PART)
        self._parts[state.rank] = part
        self._events += part[0] - old[0]
        self._hooked += part[1] - old[1]
        self._exited += part[2] - old[2]
        self._warming += part[3] - old[3]  # hooked ranks that finished no step yet
        self._waiting += part[4] - old[4]  # live ranks in a collective or set-up, by their hooks
        if state.phase and alive:
            self._in_phase.add(state.rank)
        else:
            self._in_phase.discard(state.rank)
        return part[0] != old[0]

    def events_total(self) -> int:
        """Everything the job did, a rank starting included: start-up is progress."""
        return self._events + self.probe_progress + len(self.ranks)

    @property
    def owner(self) -> str:
        """The user most of its ranks run as (a uid, "" where no agent said): whose share of the
        incident store its incidents count in. Most, not the first: a forger would need more
        ranks than the real job to move its incidents into another user's share."""
        uids = Counter(r.uid for r in self.ranks.values() if r.uid is not None)
        return str(min(uids, key=lambda uid: (-uids[uid], uid))) if uids else ""

    @property
    def stacks_only(self) -> bool:
        return bool(self.ranks) and not self._hooked

    def stacks_moved(self, stacks: dict[int, RankStack]) -> bool:
        """Whether any rank's stack differs from the last look (the first look counts as a
        move): a job without a hook shows progress no other way."""
        return _probe(stacks) != self.stack_probe

    def moved_stacks(self, stacks: dict[int, RankStack]) -> None:
        """Record stacks that moved (`stacks_moved`) as progress."""
        self.stack_probe = _probe(stacks)
        self.probe_progress += 1
        self._undated = True

    def phase_grace(self) -> float:
        """Extra patience beyond the stall threshold: the longest declared phase's timeout."""
        return max((r.phase_timeout for r in map(self.ranks.__getitem__, self._in_phase)
                    if r.phase_age < r.phase_timeout), default=0.0)

    @property
    def warming(self) -> bool:
        """Start-up, which the warm-up grace covers: until every hooked rank finished a step (or
        recorded WARM_EVENTS events, for loops without an optimizer), as the first steps import,
        compile and allocate in silence, even under a fixed --stall-timeout. Ranks without a
        hook count no steps; their progress is judged from their stacks instead."""
        return self._warming > 0

    @property
    def started(self) -> bool:
        """Every rank reported and each hooked one is past init_process_group: from then on
        the job's shape is fixed (`admission`). Once over, it stays over."""
        self._started = self._started or (0 < self.world_size <= len(self.ranks) and not any(
            r.setup == "init_process_group" or (r.hooked and not r.groups)
            for r in self.ranks.values()))
        return self._started

    def observe(self, now: float) -> Progress:
        """Bring the stall clock up to `now`, and say whether progress ended the quiet spell,
        after how long. The clock runs from the first report: a rank that never reaches
        init_process_group, or never starts, stalls the job like any other. Start-up gets the
        warm-up grace, and each rank that starts is progress. A quiet spell that was a phase
        never enters the job's pace."""
        total, quiet = self.events_total(), self.tracker.stalled_for(now)
        # Past the threshold, a quiet spell is judged: a phase, a busy period, or a stall that
        # may yet end by itself. None of them is the rhythm of training.
        self._phase_gap = self._phase_gap or self.stalled(now)
        stamp, self._undated = None if self._undated else self._progress_at, False
        if self.tracker.observe(total, now, stamp, warm=not self._warming,
                                phase=self._phase_gap):
            self._phase_gap = False
            return Progress(now - quiet, resumed_after=quiet)
        if (not self._phase_gap and quiet >= PHASE_LOOK_AFTER_S
                and now - self._phase_looked >= PHASE_LOOK_EVERY_S):
            self._phase_looked = now
            self._phase_gap = self._quiet_is_phase(quiet)
        return Progress(now - quiet)

    def quiet_for(self, now: float) -> float:
        """Seconds since the job last progressed (0 before its first report)."""
        return self.tracker.stalled_for(now)

    def _quiet_is_phase(self, quiet: float) -> bool:
        """Whether the job, quiet for `quiet` seconds, is in a phase rather than between two
        steps of training: a rank is inside a declared phase, or no live rank is idle outside a
        collective and some rank works outside one (an evaluation on every rank; one rank's
        checkpoint while the others wait for it). A rank idle outside any collective may be
        the rhythm itself (a slow read every step), so it keeps the spell in the pace; a rank
        compiling is working (a compile at a new shape is no step of training). A rank's
        activity counts over its own quiet time: the agent measures it from the rank's last
        progress, which may precede the job's last by a moment."""
        if any(in_open_phase(self.ranks[r]) for r in self._in_phase):
            return True
        working = False
        for rank in self.ranks.values():
            # A rank compiling works, though its hook counts it in DDP's all-reduce: it
            # compiles inside the forward.
            if not rank.alive or (rank.compile_age is None and any(
                    progress.pending for progress in rank.groups)):
                continue
            if not progress_sign(rank, None, max(quiet, rank.progress_age or 0.0)):
                return False
            working = True
        return working

    @property
    def everyone_left(self) -> bool:
        return self.world_size <= len(self.ranks) == self._exited

    @property
    def exits(self) -> int:
        """How many of the ranks reported have exited."""
        return self._exited

    @property
    def live(self) -> int:
        """How many of the ranks reported are alive."""
        return len(self.ranks) - self._exited

    @property
    def all_waiting(self) -> bool:
        """Some rank is alive, and every live one waits in a collective or a set-up call, by
        its hook."""
        return 0 < self.live == self._waiting

    def threshold(self) -> float:
        """Seconds without progress after which the job counts as stalled."""
        return self.tracker.threshold(self.phase_grace(), self.hook_p99, self.warming)

    def evidence_threshold(self) -> float:
        """The threshold without the warm-up grace (`ProgressTracker.evidence_threshold`)."""
        return self.tracker.evidence_threshold(self.phase_grace(), self.hook_p99)

    def stalled(self, now: float) -> bool:
        return self.tracker.is_stalled(now, self.phase_grace(), self.hook_p99, self.warming)

    @property
    def partly_waiting(self) -> bool:
        """Some live ranks wait in a collective or a set-up call by their hooks, and others do
        not."""
        return 0 < self._waiting < self.live

    def snapshot(self, now: float, stacks: dict[int, RankStack] | None = None,
                 unreachable_nodes: tuple[str, ...] = (),
                 stalled: bool | None = None) -> JobSnapshot:
        """The job as of `now`: `stalled` as its threshold says, unless a look says otherwise
        (an early look judges it stalled)."""
        stalled = self.stalled(now) if stalled is None else stalled
        return JobSnapshot(
            job_id=self.job_id, world_size=self.world_size, now=now,
            stalled_for=self.tracker.stalled_for(now), stalled=stalled,
            ranks=tuple(self.ranks[r] for r in sorted(self.ranks)), stacks=stacks or {},
            rank_nodes=dict(self.nodes), unreachable_nodes=unreachable_nodes,
            busy_timeout=self.policy.busy_timeout,
            duplicates={rank: tuple(sorted({(self.ranks[rank].host, self.ranks[rank].pid), *more}))
                        for rank, more in self.duplicates.items()})


def _probe(stacks: dict[int, RankStack]) -> dict[int, tuple[Frame, ...]]:
    """Each rank's Python frames, to compare with the next look's."""
    return {rank: tuple(python_frames(stack.frames)) for rank, stack in stacks.items()}
