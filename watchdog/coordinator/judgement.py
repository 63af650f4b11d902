"""One job's judgement, as a state machine (coordinator process; pure: time is an argument).

When is a stall looked at, held, told, ended or followed after an exit? `step(job, now)` answers
each tick, and `conclude(job, look, stacks, now)` once a look has its stacks: each returns an
`Action` with its reason and changes nothing. The Coordinator `apply`s the action as it
carries it out, and says what else happened (`observed`, `told`, `looked`, `let_go`); only
those move the judgement, and only along TRANSITIONS (drawn in docs/design.md):

    QUIET   --look------------->  LOOKING
    LOOKING --nothing to say--->  HELD    --at `until`, or a rank exits-->  LOOKING
    LOOKING --told a notice---->  NOTICE  --at `until`, or a rank exits-->  LOOKING
    LOOKING --told a hang------>  HUNG
    LOOKING --told an exit----->  EXITED  --still hung after it, or never-->  DONE
    HELD, NOTICE (ended_at), HUNG (resumed_at) --progress-->  QUIET, or HELD if still held
    any     --let go----------->  LET_GO

A refused move is a bug: the tests raise (`STRICT`); the daemon logs it and keeps the stage,
since one job's bug must not stop its loop from judging every other job.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence

from watchdog.coordinator.actions import (
    Action,
    Close,
    EndNotice,
    Hold,
    Look,
    MarkResumed,
    Nothing,
    SawProgress,
    StopFollowing,
    Tell,
    TellStillHung,
    Wait,
)
from watchdog.coordinator.after_exit import AfterExit, StillHung, after_exit
from watchdog.coordinator.jobs import JobView, Progress
from watchdog.coordinator.node_silence import NodeSilence
from watchdog.coordinator.startup import setup_call
from watchdog.coordinator.verdict import decide
from watchdog.frames import stuck_frame
from watchdog.model import JobSnapshot, JobState, Kind, RankStack, Severity, Verdict
from watchdog.schema import Incident, is_hang
from watchdog.text import printable, ranks_text

log = logging.getLogger(__name__)

STACK_SAMPLES = 3  # stacks of each rank when a job stalled: does its Python move?
RECHECK_S = 10.0  # a stall whose ranks work is looked at again after this long
LEARNED_MARGIN = 1.25  # a stall that ended by itself after S seconds is expected to take this x S
STRICT = False  # raise on a refused transition (the tests set it)


class Stage(enum.Enum):
    QUIET = "quiet"  # nothing said of the job's current spell; judged when it needs it
    LOOKING = "looking"  # stacks asked for: the look's conclusion decides
    HELD = "held"  # looked at, nothing said: not again before `until`, unless a rank exits
    NOTICE = "told a notice"  # RANK_BUSY said: looked at again at `until`; progress ends it
    HUNG = "told a hang"  # nothing more to judge until progress contradicts it
    EXITED = "told an exit"  # followed: are its peers still hung a threshold after it?
    LET_GO = "let go"  # the job is being ended on purpose: what follows is that end
    DONE = "done"  # the exit was followed to its end: nothing more to decide


TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    Stage.QUIET: frozenset({Stage.LOOKING, Stage.LET_GO}),
    Stage.LOOKING: frozenset({Stage.QUIET, Stage.HELD, Stage.NOTICE, Stage.HUNG, Stage.EXITED,
                              Stage.LET_GO}),
    Stage.HELD: frozenset({Stage.QUIET, Stage.LOOKING, Stage.LET_GO}),
    Stage.NOTICE: frozenset({Stage.QUIET, Stage.HELD, Stage.LOOKING, Stage.LET_GO}),
    Stage.HUNG: frozenset({Stage.QUIET, Stage.HELD, Stage.LET_GO}),
    Stage.EXITED: frozenset({Stage.DONE, Stage.LET_GO}),
    Stage.LET_GO: frozenset(),
    Stage.DONE: frozenset({Stage.LET_GO}),
}
# The stages a job rests in between looks: which one follows from what was told and held.
_RESTING = frozenset({Stage.QUIET, Stage.HELD, Stage.NOTICE, Stage.HUNG})
_JUDGED = frozenset({Stage.QUIET, Stage.HELD, Stage.NOTICE})  # ...and may be looked at in
# Before every rank stepped, only these verdicts may end the warm-up early: a rank idle in its
# own code while its peers wait for it (exits are judged at any time anyway).
_EARLY_KINDS = frozenset({Kind.MISSING_RANKS, Kind.COLLECTIVE_MISMATCH, Kind.RANK_STALLED})


class IllegalTransition(RuntimeError):
    pass


class Judgement:
    def __init__(self, job_id: str, nodes: NodeSilence) -> None:
        self.job_id = job_id
        self.nodes = nodes  # the coordinator's: which nodes went silent
        self.stage = Stage.QUIET
        self.incident: Incident | None = None  # the last told: open, or closed by progress
        self._told_at: int | None = None  # the job's event count then; None once closed
        self._told_exits = 0  # ranks exited then
        self.until = 0.0  # the current stall is looked at again only then (0: not held)
        self._held_exits = 0  # ranks exited when it was held
        self.busy = False  # ranks were seen working through the current stall
        self.place = ""  # where its culprits were: to learn how long a stall there lasts
        self.learned: dict[str, float] = {}  # place -> the longest stall there that ended itself
        self.hung_before = False  # a hang was told, and not contradicted
        self._quiet_since = 0.0  # when the spell the latest observation looked at began

    # -- what the job's state says, for `watchdog status` --
    @property
    def open(self) -> bool:
        """The incident told stands: progress has not closed it yet."""
        return self._told_at is not None

    @property
    def hung(self) -> bool:
        """A hang (an exit included) stands."""
        return self.incident is not None and self.open and is_hang(self.incident)

    def verdict(self, job: JobView) -> Incident | None:
        """What `status` shows: the incident while it stands, or for good once the job is
        done (every rank left, or a rank's exit was told)."""
        done = job.everyone_left or self._exit_told
        return self.incident if self.open or done else None

    def job_state(self, job: JobView, now: float) -> JobState:
        if job.ranks and job.everyone_left:
            clean = finished_cleanly(job) and not self.hung_before
            return JobState.FINISHED if clean else JobState.FAILED
        if self._exit_told:
            return JobState.FAILED
        if self.hung:
            return JobState.HUNG
        return JobState.STALLED if job.stalled(now) and not self.busy else JobState.RUNNING

    @property
    def _exit_told(self) -> bool:
        return self.incident is not None and self.incident["kind"] == Kind.RANK_EXITED

    # -- decisions: pure --
    def step(self, job: JobView, now: float) -> Action:
        """This tick's decision: the open incident that progress closes first, then an exit
        followed, then whether to look."""
        if self._closed_by_progress(job):
            return self._close(job, now)
        if self.stage is Stage.EXITED:
            return self._follow_exit(job, now)
        return self._judge(job, now)

    def _closed_by_progress(self, job: JobView) -> bool:
        """Progress resumed: the next stall is a new incident. Not once a rank exited after a
        hang was told: the job is ending (`--on-hang kill`'s own signals, say), and an exit's
        last beacon write, or a killed rank's state without one, moves the count too; the exits
        that hang caused are no new incident."""
        ending = self.hung and job.exits > self._told_exits
        moved = self.open and job.events_total() != self._told_at and not ending
        # A job that finished cleanly with a hang told and nobody acting: no hang after all.
        return moved or (self.stage is Stage.HUNG and finished_cleanly(job))

    def _close(self, job: JobView, now: float) -> Action:
        said = self.incident
        assert said is not None
        # Dated by the hooks' own stamp of the progress where they have one; an incident said
        # just after its ranks moved on ends when it was said, not before.
        moved_at = max(now - job.quiet_for(now), said["detected_at"])
        if finished_cleanly(job):  # its ranks' exits were its progress
            moved_at = max(min(r.exited_at or now for r in job.ranks.values()), moved_at)
        lasted = moved_at - self._quiet_since
        if said["severity"] == Severity.NOTICE:
            return EndNotice(incident={**said, "ended_at": moved_at}, lasted=lasted,
                             reason=f"{ranks_text(said['culprit_ranks'])} moved on")
        if said["kind"] == Kind.RANK_EXITED:
            return Close(reason="an exit is no claim that progress can contradict")
        if self.stage is Stage.LET_GO:
            return Close(reason="the job is being ended: its ranks' shutdown is that end")
        return MarkResumed(
            incident={**said, "resumed_at": moved_at}, lasted=lasted, level=logging.WARNING,
            reason=f"made progress {moved_at - said['detected_at']:.0f} s after hang incident "
                   f"{said['id']} ({said['kind']}) with nobody acting on it: the verdict was wrong")

    def _follow_exit(self, job: JobView, now: float) -> Action:
        """An exit is the launcher's to handle; whether the job is still hung a threshold after
        it is decided once (`after_exit`)."""
        assert self.incident is not None
        outcome = after_exit(job, self.incident, now)
        if isinstance(outcome, StillHung):
            return TellStillHung(still=outcome, reason=outcome.text(), level=logging.WARNING)
        if outcome is AfterExit.NEVER:
            return StopFollowing(reason="its peers went on, every rank left, or the launcher "
                                        "is ending them")
        return Wait(reason="its peers have not waited a threshold since the exit")

    def _judge(self, job: JobView, now: float) -> Action:
        """Whether to look at the job, with stacks: a stall is always looked at with them
        (CPU time alone can be a spinning wait); so is a job due an early look, and a job a
        rank left that an exit verdict names."""
        if self.stage not in _JUDGED:
            return Nothing(reason=f"{self.stage.value}: nothing to look at")
        if self.incident is not None and job.everyone_left:
            return Nothing(reason="every rank left")
        if now < self.until and job.exits == self._held_exits:
            return Wait(reason="held: looked at again later, or when a rank exits")
        stalled = job.stalled(now)
        early = not stalled and self.early_look(job, now)
        if not (job.exits or stalled or early):
            return Nothing(reason="the job progresses")
        unreachable = self.nodes.unreachable(job.nodes.values(), now)
        if unreachable is None:
            return Wait(reason="a node missed a few reports: its ranks' state is not known yet")
        if not (stalled or early) and decide(
                job.snapshot(now, unreachable_nodes=unreachable)) is None:
            return Nothing(reason="a rank left, and nothing is wrong")
        why = ("no progress for" if stalled else "quiet during the warm-up for" if early
               else "a rank left; quiet for")
        return Look(samples=STACK_SAMPLES if stalled or early else 1, early=early,
                    unreachable=unreachable, first=stalled and not self.until,
                    reason=f"{why} {job.quiet_for(now):.0f} s")

    def early_look(self, job: JobView, now: float) -> bool:
        """Held back by the warm-up grace, but quiet past the floor (or the threshold the pace
        sets, if longer) while some ranks wait in a collective or a set-up call and others do
        not: the job is looked at all the same, and judged only on evidence of a rank idle
        while its peers wait (`early_verdict_stands`). Start-up is judged on evidence, not on
        the clock alone."""
        if not job.partly_waiting or not job.tracker.seen or job.stalled(now):
            return False
        return job.quiet_for(now) >= max(job.policy.floor, job.evidence_threshold())

    def conclude(self, job: JobView, look: Look, stacks: dict[int, RankStack],
                 now: float) -> Action:
        """What a look decides, its stacks in hand: the verdict to tell now, or nothing yet
        and when to look again."""
        late = self._late_node(job, look.unreachable, stacks, now)
        if late:
            return Hold(until=now + RECHECK_S, exits=job.exits, reason=late,
                        level=logging.WARNING)
        stalled = job.stalled(now) or (look.early and self.early_look(job, now))
        snapshot = job.snapshot(now, stacks, look.unreachable, stalled)
        verdict = decide(snapshot)
        if look.early and verdict is not None and not early_verdict_stands(snapshot, verdict):
            verdict = None  # start-up that shows work, or no waiter: the warm-up goes on
        if verdict is None:  # progress resumed, or every rank works: look again later
            # an early look again soon, but never past the end of the warm-up grace
            again = min(RECHECK_S, job.threshold() - snapshot.stalled_for
                        if look.early else RECHECK_S)
            return Hold(until=now + again, exits=job.exits,
                        busy=snapshot.stalled and not look.early,
                        reason="no verdict: every rank works, or the job moved on")
        if job.stacks_only and job.stacks_moved(snapshot.stacks):
            return SawProgress(stacks=snapshot.stacks, reason="no hook: its stacks moved, the "
                                                              "only sign of progress there is")
        if verdict.kind is Kind.RANK_EXITED:
            return Tell(verdict=verdict, snapshot=snapshot, reason=verdict.summary)
        return self._tell_or_hold(job, snapshot, verdict, now)

    def _tell_or_hold(self, job: JobView, snapshot: JobSnapshot, verdict: Verdict,
                      now: float) -> Action:
        """A stall where an earlier one ended by itself is held until it lasted as long; a
        notice is said once, and looked at again soon and at the busy timeout."""
        place = culprit_place(snapshot, verdict.culprit_ranks)
        expected = LEARNED_MARGIN * self.learned.get(place, 0.0)
        if snapshot.stalled_for < expected:
            return Hold(until=now + expected - snapshot.stalled_for, exits=job.exits,
                        place=place, level=logging.INFO,
                        reason=f"a stall at {place} ended by itself after "
                               f"{expected / LEARNED_MARGIN:.0f} s before; waiting")
        if verdict.severity is Severity.HANG:
            return Tell(verdict=verdict, snapshot=snapshot, place=place, reason=verdict.summary)
        hold = Hold(until=now + min(RECHECK_S, snapshot.busy_timeout - snapshot.stalled_for),
                    exits=job.exits, busy=True, place=place,
                    reason="busy: looked at again soon, and at the busy timeout")
        said = self.incident if self.open else None
        if said is not None and (said["kind"], said["culprit_ranks"]) == (
                verdict.kind, list(verdict.culprit_ranks)):
            return hold  # a notice is said once
        return Tell(verdict=verdict, snapshot=snapshot, hold=hold, place=place,
                    reason=verdict.summary)

    def _late_node(self, job: JobView, unreachable: tuple[str, ...],
                   stacks: dict[int, RankStack], now: float) -> str:
        """Why nothing can be said yet, where a node taken for unreachable answered for its
        ranks' stacks just now: its agent lives, only its reports are late (a slow scan), so
        its ranks' state is not known yet; else ''."""
        answered = {job.nodes.get(rank) for rank in stacks}
        late = [node for node in unreachable if node in answered]
        if not late:
            return ""
        return (f"node {printable(late[0])} answered for stacks but sent no report for "
                f"{self.nodes.age(late[0], now):.0f} s; looking again later")

    # -- what the Coordinator did: moves --
    def apply(self, action: Action) -> bool:
        """The Coordinator carries `action` out; False when the judgement refuses the move it
        makes (a bug: see `_move`), and then it must not be carried out."""
        if isinstance(action, Look):
            return self._move(Stage.LOOKING)
        if isinstance(action, TellStillHung | StopFollowing):
            return self._move(Stage.DONE)
        if isinstance(action, EndNotice | MarkResumed | Close):
            self._told_at = None
            if isinstance(action, EndNotice | MarkResumed):
                self.incident = action.incident
            self.hung_before = self.hung_before and not isinstance(action, MarkResumed)
            self._rest()
        elif isinstance(action, Hold):
            self._hold(action)
        elif isinstance(action, Tell):
            if action.hold is not None:
                self._hold(action.hold)
            self.place = self.place if action.place is None else action.place
        return True

    def _hold(self, hold: Hold) -> None:
        self.until, self._held_exits = hold.until, hold.exits
        self.busy = self.busy if hold.busy is None else hold.busy
        self.place = self.place if hold.place is None else hold.place

    def observed(self, progress: Progress) -> None:
        """What the job's stall clock saw this tick. A stall that ended by itself: how long it
        lasted where its culprits were is what the next stall there may last (a checkpoint, an
        evaluation) before it is called anything."""
        self._quiet_since = progress.quiet_since
        if progress.resumed_after is None:
            return
        if self.place:
            self.learned[self.place] = max(self.learned.get(self.place, 0.0),
                                           progress.resumed_after)
        self.until, self.busy, self.place = 0.0, False, ""
        self._rest()

    def told(self, incident: Incident, events: int, exits: int) -> None:
        """`incident` was told (or found stored) when the job counted `events` and `exits`: it
        stands until progress resumes."""
        self.incident, self._told_at, self._told_exits = incident, events, exits
        self.hung_before = self.hung_before or is_hang(incident)

    def looked(self) -> None:
        """The look is over: the job rests where what it told and held leave it."""
        if self.stage is Stage.LOOKING:
            self._move(Stage.EXITED if self._exit_told else self._resting())

    def let_go(self) -> None:
        """The job is being ended on a hang's verdict, or by the user: its ranks' exits, which
        that end causes, are no new incident."""
        if self.stage is not Stage.LET_GO:
            self._move(Stage.LET_GO)

    def _rest(self) -> None:
        if self.stage in _RESTING:
            self._move(self._resting())

    def _resting(self) -> Stage:
        if self.incident is not None and self.open:
            return Stage.HUNG if is_hang(self.incident) else Stage.NOTICE
        return Stage.HELD if self.until else Stage.QUIET

    def _move(self, to: Stage) -> bool:
        if to is not self.stage and to not in TRANSITIONS[self.stage]:
            if STRICT:
                raise IllegalTransition(f"{self.stage.value} -> {to.value}")
            log.error("job %s: its judgement cannot go from %s to %s; it stays %s",
                      printable(self.job_id), self.stage.value, to.value, self.stage.value)
            return False
        self.stage = to
        return True


def early_verdict_stands(snapshot: JobSnapshot, verdict: Verdict) -> bool:
    """Whether a verdict reached during the warm-up grace may be told now: an exit, or a hang
    whose culprits are live ranks whose stacks were taken, outside any set-up call, while other
    ranks wait in a collective. The verdict already showed that its culprits make no progress
    (a hang, not RANK_BUSY); a rank that was never seen, or waits in a set-up call itself (a
    slow rendezvous), gets the warm-up."""
    if verdict.kind is Kind.RANK_EXITED:
        return True
    if verdict.kind not in _EARLY_KINDS or not verdict.waiting_ranks or not verdict.culprit_ranks:
        return False
    ranks = {state.rank: state for state in snapshot.ranks if state.alive}
    for culprit in verdict.culprit_ranks:
        stack = snapshot.stacks.get(culprit)
        state = ranks.get(culprit)
        if state is None or stack is None or not stack.frames or setup_call(state, stack):
            return False
    return True


def culprit_place(snapshot: JobSnapshot, culprits: Sequence[int]) -> str:
    """'train.py:save_checkpoint': where the first culprit with a stack is stuck, or ''."""
    for rank in culprits:
        stack = snapshot.stacks.get(rank)
        frame = stuck_frame(stack.frames) if stack is not None else None
        if frame is not None:
            return f"{frame.file}:{frame.function}"
    return ""


def finished_cleanly(job: JobView) -> bool:
    """Every rank of the job left, each by a clean exit with code 0."""
    return bool(job.ranks) and job.everyone_left and all(
        r.clean_exit and r.exit_code == 0 for r in job.ranks.values())
