"""A job's judgement as a table: (the stage it is in, the job's view, the time) -> the action
it decides, with what the Coordinator needs to carry it out; then what a look concludes, its
stacks in hand; then the moves themselves, which only TRANSITIONS allows. The job is the 4-rank
demo job: rank 1 never reaches all_reduce #57, where ranks 0, 2 and 3 wait."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.helpers.builders import (
    DATA_STALL,
    DDP_BACKWARD,
    IN_RENDEZVOUS,
    JOB,
    POLICY,
    PREPARING,
    T0,
    TRAIN,
    done,
    entered,
    exited,
    joined,
    joining,
    judgement,
    rank,
    told,
)
from watchdog.coordinator import judgement as judging
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
from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.judgement import (
    RECHECK_S,
    TRANSITIONS,
    IllegalTransition,
    Judgement,
    Stage,
)
from watchdog.coordinator.stall import StallPolicy
from watchdog.model import Activity, Frame, Kind, RankStack, RankState, Verdict

FIXED = StallPolicy(fixed=5.0)  # past start-up, a job is stalled after 5 s without progress
STUCK = rank(1, done(56, 2.0), activity=Activity(window=3.0))  # never reached #57, idle
WAITING = tuple(rank(r, entered(57, 3.0)) for r in (0, 2, 3))
COMPUTING = Activity(window=3.0, main_cpu=0.98, process_cpu=1.0)
HANG = {"id": "h1", "job_id": JOB, "detected_at": T0 + 6.0, "kind": "MISSING_RANKS",
        "severity": "hang", "culprit_ranks": [1]}
NOTICE = {**HANG, "id": "n1", "kind": "RANK_BUSY", "severity": "notice"}
EXIT = {**HANG, "id": "e1", "kind": "RANK_EXITED"}
LEFT = exited(rank(1, done(56, 2.0)), at=5.0, code=0, clean=True)  # an early, clean exit 0
A_LOOK = Look(samples=3, early=False, unreachable=(), first=True, reason="a test's")
PLACE = f"{TRAIN}:read_sample_from_storage"


def job(*states: RankState, policy: StallPolicy = FIXED, at: float = 0.0) -> JobView:
    """The job's view, its ranks reported and its stall clock started at T0 + `at`."""
    view = JobView(JOB, policy)
    for state in states:
        view.update(f"node-{state.rank // 2}", state)
    view.observe(T0 + at)
    return view


def stalled() -> JobView:
    return job(STUCK, *WAITING)


def warming(policy: StallPolicy = POLICY) -> JobView:
    """Before the first step: ranks 0-2 wait in init_process_group, rank 3 prepares its data."""
    return job(*(joining(r) for r in range(3)), rank(3, steps=0, events=0), policy=policy)


def exit_waited_since(quiet: float) -> JobView:
    """Rank 1 exited 0 at T0 + 5; its peers wait in #57, quiet since T0 + `quiet`."""
    return job(*WAITING, LEFT, policy=POLICY, at=quiet)


def moved(judged: Judgement, view: JobView, at: float, *ranks: int,
          progress_age: float | None = None) -> None:
    """`ranks` (all: every one) made progress, reported at T0 + `at` (`progress_age` seconds
    before, by their hooks' stamps), and the coordinator's tick saw it."""
    received = T0 + at if progress_age is not None else None
    for r in ranks or tuple(view.ranks):
        state = view.ranks[r]
        view.update(view.nodes[r], dataclasses.replace(
            state, events=state.events + 1, progress_age=progress_age), received)
    judged.observed(view.observe(T0 + at))


def held(view: JobView, until: float) -> Judgement:
    """Looked at, nothing said: held until T0 + `until`."""
    judged = judgement(JOB)
    judged.apply(A_LOOK)
    judged.apply(Hold(until=T0 + until, exits=view.exits, reason="a test's"))
    judged.looked()
    return judged


def noticed(view: JobView, until: float = 18.0) -> Judgement:
    """A RANK_BUSY notice told, looked at again at T0 + `until`."""
    judged = judgement(JOB)
    judged.apply(A_LOOK)
    judged.apply(Hold(until=T0 + until, exits=view.exits, busy=True, reason="a test's"))
    judged.told(NOTICE, view.events_total(), view.exits)
    judged.looked()
    return judged


Given = tuple[Judgement, JobView]


def fresh(view: Callable[[], JobView]) -> Callable[[], Given]:
    return lambda: (judgement(JOB), view())


def after(make: Callable[[JobView], Judgement], view: Callable[[], JobView],
          then: Callable[[Judgement, JobView], object] = lambda *_: None) -> Callable[[], Given]:
    """The judgement `make` makes of the job `view` makes, and what `then` did after."""
    def scenario() -> Given:
        made = view()
        judged = make(made)
        then(judged, made)
        return judged, made
    return scenario


def hang(view: JobView) -> Judgement:
    return told(judgement(JOB), view, HANG)


def exit_told(view: JobView) -> Judgement:
    return told(judgement(JOB), view, EXIT)


def let_go(make: Callable[[JobView], Judgement]) -> Callable[[JobView], Judgement]:
    def then(view: JobView) -> Judgement:
        judged = make(view)
        judged.let_go()
        return judged
    return then


def followed(view: JobView) -> Judgement:
    judged = exit_told(view)
    judged.apply(StopFollowing(reason="a test's"))
    return judged


def silent_node(lost: bool) -> Given:
    """Node node-0 (ranks 0 and 1) last reported 7 s before (silent) or 23 s (unreachable)."""
    judged, view = judgement(JOB), stalled()
    for at in (-2.9, -1.9):
        judged.nodes.heard("node-0", T0 + at - (16.0 if lost else 0.0))
    return judged, view


def killed_after_hang(judged: Judgement, view: JobView) -> None:
    """`--on-hang kill` ends ranks 0, 2, 3: their last states (events 0, without a beacon) move
    the job's count."""
    for state in WAITING:
        view.update(view.nodes[state.rank], exited(dataclasses.replace(state, events=0),
                                                   at=7.0, code=None, clean=False))
    judged.observed(view.observe(T0 + 9.0))


def exits_during_hold(judged: Judgement, view: JobView) -> None:
    view.update("node-0", exited(view.ranks[1], at=7.0, code=3, clean=True))


@dataclass(frozen=True)
class Row:
    """At T0 + `at`, the judgement and the job `given` makes are in `stage` and decide `action`,
    whose fields include `fields`; carried out, it moves the judgement to `then`."""

    given: Callable[[], Given]
    at: float
    stage: Stage
    action: type[Action]
    fields: dict[str, object] = field(default_factory=dict)
    then: Stage | None = None  # None: the same stage


STEPS = {
    # quiet: looked at once it needs it
    "a job that progresses is left alone": Row(fresh(stalled), 4.9, Stage.QUIET, Nothing),
    "a stall past its threshold is looked at, 3 stacks a rank": Row(
        fresh(stalled), 5.1, Stage.QUIET, Look, {"samples": 3, "early": False, "first": True},
        then=Stage.LOOKING),
    "a rank that exited with an error is looked at at once, 1 stack a rank": Row(
        fresh(lambda: job(exited(STUCK, at=0.5, code=1, clean=True), *WAITING)), 1.0,
        Stage.QUIET, Look, {"samples": 1, "early": False, "first": False}, then=Stage.LOOKING),
    "a rank that finished cleanly while no one waits for it is no verdict": Row(
        fresh(lambda: job(exited(joined(1), at=0.5, code=0, clean=True), joined(0), joined(2),
                          joined(3))), 1.0, Stage.QUIET, Nothing),
    "a node that missed a few reports: its ranks' state is not known yet": Row(
        lambda: silent_node(lost=False), 5.1, Stage.QUIET, Wait),
    "a node silent past the node timeout is unreachable, and named": Row(
        lambda: silent_node(lost=True), 5.1, Stage.QUIET, Look, {"unreachable": ("node-0",)},
        then=Stage.LOOKING),
    # start-up: judged on evidence, looked at once the floor passes while some ranks wait
    "during the warm-up, quiet under the floor: left alone": Row(
        fresh(warming), POLICY.floor - 1, Stage.QUIET, Nothing),
    "during the warm-up, quiet past the floor while some wait: an early look": Row(
        fresh(warming), POLICY.floor, Stage.QUIET, Look,
        {"samples": 3, "early": True, "first": False}, then=Stage.LOOKING),
    "the warm-up over: a stall like any other": Row(
        fresh(warming), POLICY.warmup, Stage.QUIET, Look, {"early": False, "first": True},
        then=Stage.LOOKING),
    "an early look waits for the floor, even under a shorter fixed --stall-timeout": Row(
        fresh(lambda: warming(StallPolicy(fixed=3.0))), 3.0, Stage.QUIET, Nothing),
    "...and comes at the floor": Row(
        fresh(lambda: warming(StallPolicy(fixed=3.0))), POLICY.floor, Stage.QUIET, Look,
        {"early": True}, then=Stage.LOOKING),
    # held: looked at again at its time, or at once when a rank exits
    "held: not looked at before its time": Row(
        after(lambda v: held(v, until=20.0), stalled), 19.0, Stage.HELD, Wait),
    "held: looked at again at its time, no new stall": Row(
        after(lambda v: held(v, until=20.0), stalled), 20.0, Stage.HELD, Look,
        {"first": False}, then=Stage.LOOKING),
    "a rank that exits during a notice's hold is judged at once": Row(
        after(lambda v: noticed(v, until=20.0), stalled, exits_during_hold), 8.0, Stage.NOTICE,
        Look, {"samples": 3}, then=Stage.LOOKING),
    # told a notice: looked at again; progress ends it
    "a notice: held until its next look": Row(after(noticed, stalled), 10.0, Stage.NOTICE, Wait),
    "a notice whose ranks moved on ends when they did": Row(
        after(noticed, stalled, lambda j, v: moved(j, v, 30.0)), 30.0, Stage.NOTICE, EndNotice,
        {"incident": {**NOTICE, "ended_at": T0 + 30.0}, "lasted": 30.0}, then=Stage.QUIET),
    "a notice said just after its ranks moved on ends when it was said": Row(
        after(noticed, stalled, lambda j, v: moved(j, v, 6.5, progress_age=2.5)), 6.5,
        Stage.NOTICE, EndNotice, {"incident": {**NOTICE, "ended_at": T0 + 6.0}, "lasted": 6.0},
        then=Stage.QUIET),
    "news of progress older than the spell ends a notice, not its hold": Row(
        after(noticed, stalled, lambda j, v: moved(j, v, 10.0, progress_age=12.0)), 10.0,
        Stage.NOTICE, EndNotice, {"incident": {**NOTICE, "ended_at": T0 + 6.0}},
        then=Stage.HELD),
    # told a hang: nothing to judge until progress contradicts it
    "a hang stands while the job is quiet": Row(after(hang, stalled), 60.0, Stage.HUNG, Nothing),
    "a hang the job contradicts: resumed, the watchdog's own error": Row(
        after(hang, stalled, lambda j, v: moved(j, v, 9.0)), 9.0, Stage.HUNG, MarkResumed,
        {"incident": {**HANG, "resumed_at": T0 + 9.0}, "lasted": 9.0,
         "level": logging.WARNING}, then=Stage.QUIET),
    "...told while a hold stood, and contradicted by old news: held": Row(
        after(lambda v: told(held(v, until=20.0), v, HANG), stalled,
              lambda j, v: moved(j, v, 10.0, progress_age=12.0)), 10.0, Stage.HUNG,
        MarkResumed, {"incident": {**HANG, "resumed_at": T0 + 6.0}}, then=Stage.HELD),
    "ranks that exit after a hang was told do not reopen it": Row(
        after(hang, stalled, killed_after_hang), 9.0, Stage.HUNG, Nothing),
    # told an exit: followed for its peers still waiting a threshold later (the floor here)
    "an exit's peers wait, 9 s after it": Row(
        after(exit_told, lambda: exit_waited_since(3.0)), 14.0, Stage.EXITED, Wait),
    "an exit's peers still wait 10 s after it: told once": Row(
        after(exit_told, lambda: exit_waited_since(3.0)), 15.0, Stage.EXITED, TellStillHung,
        {"level": logging.WARNING}, then=Stage.DONE),
    "an exit's peers went on: followed no more": Row(
        after(exit_told, lambda: exit_waited_since(15.5)), 16.0, Stage.EXITED, StopFollowing,
        then=Stage.DONE),
    "progress closes an exit, which it cannot contradict": Row(
        after(exit_told, stalled, lambda j, v: moved(j, v, 9.0)), 9.0, Stage.EXITED, Close),
    # let go: the job is being ended on purpose
    "a job let go is judged no more": Row(
        after(let_go(lambda v: judgement(JOB)), stalled), 60.0, Stage.LET_GO, Nothing),
    "a hang let go that progress closes is no error of the watchdog's": Row(
        after(let_go(hang), stalled, lambda j, v: moved(j, v, 9.0)), 9.0, Stage.LET_GO, Close),
    "a notice let go still ends when its ranks move on": Row(
        after(let_go(noticed), stalled, lambda j, v: moved(j, v, 30.0)), 30.0, Stage.LET_GO,
        EndNotice),
    # done
    "an exit followed to its end: nothing more to decide": Row(
        after(followed, lambda: exit_waited_since(3.0)), 60.0, Stage.DONE, Nothing),
}


@pytest.mark.parametrize("row", STEPS.values(), ids=STEPS.keys())
def test_step(row: Row) -> None:
    judged, view = row.given()
    assert judged.stage is row.stage
    action = judged.step(view, T0 + row.at)
    assert type(action) is row.action, action
    assert {name: getattr(action, name) for name in row.fields} == row.fields
    assert judged.apply(action)
    assert judged.stage is (row.then or row.stage)


# -- what a look concludes, its stacks in hand ---------------------------------------------

STACKS = {0: DDP_BACKWARD, 1: DATA_STALL, 2: DDP_BACKWARD, 3: DDP_BACKWARD}
AT_START = {0: IN_RENDEZVOUS, 1: IN_RENDEZVOUS, 2: IN_RENDEZVOUS, 3: PREPARING}


def stacks(frames: dict[int, tuple[Frame, ...]]) -> dict[int, RankStack]:
    return {r: RankStack(r, 4242 + r, f) for r, f in frames.items()}


def learned(view: JobView) -> Judgement:
    """A stall at rank 1's data read ended by itself after 30 s, once."""
    judged = judgement(JOB)
    judged.learned[PLACE] = 30.0
    return judged


def look(early: bool = False, unreachable: tuple[str, ...] = ()) -> Look:
    return Look(samples=3, early=early, unreachable=unreachable, first=True, reason="a test's")


@dataclass(frozen=True)
class Concluded:
    """At T0 + `at`, a look (`looked`) with `frames` in hand, of the judgement and the job
    `given` makes, concludes `action` with `fields`; `kind`: of the verdict a Tell tells."""

    given: Callable[[], Given]
    frames: dict[int, tuple[Frame, ...]]
    at: float
    action: type[Action]
    fields: dict[str, object] = field(default_factory=dict)
    kind: Kind | None = None
    looked: Look = field(default_factory=look)


BUSY_STUCK = dataclasses.replace(STUCK, activity=COMPUTING)
CONCLUSIONS = {
    "a culprit idle in its own code while its peers wait: told, and where it is": Concluded(
        fresh(stalled), STACKS, 5.1, Tell, {"place": PLACE, "hold": None},
        Kind.MISSING_RANKS),
    "where a stall ended by itself after 30 s, the next is held until it lasted 37.5": Concluded(
        after(learned, stalled), STACKS, 5.1, Hold,
        {"until": T0 + 37.5, "place": PLACE, "level": logging.INFO}),
    "every rank computing outside any collective: a long phase, looked at again": Concluded(
        fresh(lambda: job(*(joined(r, activity=COMPUTING) for r in range(4)))), {}, 5.1, Hold,
        {"until": T0 + 5.1 + RECHECK_S, "busy": True, "place": None}),
    "a culprit that works while its peers wait: a notice, looked at again": Concluded(
        fresh(lambda: job(BUSY_STUCK, *WAITING)), STACKS, 5.1, Tell,
        {"hold": Hold(until=T0 + 5.1 + RECHECK_S, exits=0, busy=True, place=PLACE,
                      reason="busy: looked at again soon, and at the busy timeout"),
         "place": PLACE}, Kind.RANK_BUSY),
    "...a notice already said is not said again": Concluded(
        after(noticed, lambda: job(BUSY_STUCK, *WAITING)), STACKS, 5.1, Hold,
        {"busy": True, "place": PLACE}),
    "...and near the busy timeout, it is looked at again at it": Concluded(
        fresh(lambda: job(BUSY_STUCK, *WAITING)), STACKS, 595.1, Tell,
        {"hold": Hold(until=T0 + 600.0, exits=0, busy=True, place=PLACE,
                      reason="busy: looked at again soon, and at the busy timeout")},
        Kind.RANK_BUSY),
    "an early look: a rank idle before init_process_group is named before the warm-up ends":
        Concluded(fresh(warming), AT_START, POLICY.floor, Tell, {}, Kind.MISSING_RANKS,
                  look(early=True)),
    "an early look: a rank that works keeps its warm-up, looked at again before it ends":
        Concluded(fresh(lambda: job(*(joining(r) for r in range(3)),
                                    rank(3, steps=0, events=0, activity=COMPUTING),
                                    policy=POLICY)),
                  AT_START, 55.0, Hold, {"until": T0 + POLICY.warmup, "busy": False},
                  looked=look(early=True)),
    "no hook: its stacks moved, which is its progress": Concluded(
        fresh(lambda: job(*(rank(r, hooked=False, heartbeat_age=None, steps=0, events=0)
                            for r in range(4)))), STACKS, 5.1, SawProgress),
    "a node taken for unreachable answered for its ranks' stacks: nothing yet": Concluded(
        fresh(stalled), STACKS, 5.1, Hold, {"until": T0 + 5.1 + RECHECK_S,
                                            "level": logging.WARNING},
        looked=look(unreachable=("node-0",))),
    "an exit: told at once, nothing learned of where": Concluded(
        fresh(lambda: job(exited(STUCK, at=0.5, code=1, clean=True), *WAITING)), {}, 1.0, Tell,
        {"place": None, "hold": None}, Kind.RANK_EXITED),
}


@pytest.mark.parametrize("row", CONCLUSIONS.values(), ids=CONCLUSIONS.keys())
def test_conclude(row: Concluded) -> None:
    judged, view = row.given()
    action = judged.conclude(view, row.looked, stacks(row.frames), T0 + row.at)
    assert type(action) is row.action, action
    assert {name: getattr(action, name) for name in row.fields} == row.fields
    if isinstance(action, Tell):
        assert action.verdict.kind is row.kind


# -- the moves --------------------------------------------------------------------------------

def test_the_table_lists_every_stage_and_any_may_be_let_go() -> None:
    assert set(TRANSITIONS) == set(Stage)
    assert all(Stage.LET_GO in TRANSITIONS[stage] for stage in Stage if stage is not Stage.LET_GO)
    assert TRANSITIONS[Stage.LET_GO] == frozenset()


def tell(kind: Kind, incident: dict[str, object], hold: Hold | None = None
         ) -> Callable[[Judgement, JobView], None]:
    """A look that told a verdict of `kind`, as `incident`."""
    def then(judged: Judgement, view: JobView) -> None:
        verdict = Verdict(kind, "a test's", (1,), (0, 2, 3))
        judged.apply(Tell(verdict=verdict, snapshot=view.snapshot(T0 + 5.1), hold=hold,
                          reason="a test's"))
        judged.told(incident, view.events_total(), view.exits)
    return then


A_HOLD = Hold(until=T0 + 15.0, exits=0, busy=True, reason="a test's")
LOOKS_END = {
    "a look that decided nothing (it failed) leaves the job quiet":
        (lambda j, v: None, Stage.QUIET),
    "...one that held it, held": (lambda j, v: j.apply(A_HOLD), Stage.HELD),
    "...one whose stacks moved (no hook), quiet": (
        lambda j, v: j.apply(SawProgress(stacks={}, reason="a test's")), Stage.QUIET),
    "...one that told a notice, with it": (tell(Kind.RANK_BUSY, NOTICE, A_HOLD), Stage.NOTICE),
    "...one that told a hang, with it": (tell(Kind.MISSING_RANKS, HANG), Stage.HUNG),
    "...one that told an exit, following it": (tell(Kind.RANK_EXITED, EXIT), Stage.EXITED),
    "...one during which the job was let go, let go": (lambda j, v: j.let_go(), Stage.LET_GO),
}


@pytest.mark.parametrize(("then", "stage"), LOOKS_END.values(), ids=LOOKS_END.keys())
def test_a_look_rests_where_what_it_decided_leaves_the_job(
        then: Callable[[Judgement, JobView], None], stage: Stage) -> None:
    judged, view = judgement(JOB), stalled()
    judged.apply(A_LOOK)
    assert judged.stage is Stage.LOOKING
    assert type(judged.step(view, T0 + 60.0)) is Nothing  # one look at a time
    then(judged, view)
    judged.looked()
    assert judged.stage is stage


def test_progress_ends_a_hold_and_a_stall_that_ended_by_itself_is_learned_where() -> None:
    view = stalled()
    judged = held(view, until=60.0)
    judged.apply(Hold(until=T0 + 60.0, exits=0, busy=True, place=PLACE, reason="a test's"))
    assert judged.job_state(view, T0 + 20.0) == "RUNNING"  # busy, not stalled
    moved(judged, view, 30.0)
    assert judged.stage is Stage.QUIET
    assert (judged.place, judged.busy, judged.until) == ("", False, 0.0)
    assert judged.learned == {PLACE: 30.0}


def test_a_refused_move_raises_in_the_tests() -> None:
    judged = hang(stalled())
    with pytest.raises(IllegalTransition, match="told a hang -> looking"):
        judged.apply(A_LOOK)


def test_a_refused_move_is_logged_and_not_made_in_the_daemon(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """One job's bug must not stop the coordinator's loop from judging every other job: the
    move is refused, and the action it came with is not carried out."""
    monkeypatch.setattr(judging, "STRICT", False)
    judged = hang(stalled())
    assert not judged.apply(A_LOOK)
    assert judged.stage is Stage.HUNG
    assert "its judgement cannot go from told a hang to looking" in caplog.text


STATES = {
    "a job that progresses runs": (fresh(stalled), 4.9, "RUNNING", None),
    "a stalled job is stalled": (fresh(stalled), 5.1, "STALLED", None),
    "a job whose hang stands is hung, the hang its verdict": (after(hang, stalled), 60.0, "HUNG",
                                                              "h1"),
    "a job a rank's exit ended failed": (after(exit_told, stalled), 60.0, "FAILED", "e1"),
    "a job whose ranks all finished, with no hang, finished": (
        fresh(lambda: job(*(exited(joined(r), at=1.0, code=0, clean=True) for r in range(4)))),
        60.0, "FINISHED", None),
    "...and failed, where a hang was told before": (
        after(hang, lambda: job(*(exited(joined(r), at=1.0, code=0, clean=True)
                                  for r in range(4)))), 60.0, "FAILED", "h1"),
}


@pytest.mark.parametrize(("given", "at", "state", "verdict"), STATES.values(), ids=STATES.keys())
def test_what_status_says_of_a_judged_job(given: Callable[[], Given], at: float, state: str,
                                          verdict: str | None) -> None:
    judged, view = given()
    assert judged.job_state(view, T0 + at) == state
    shown = judged.verdict(view)
    assert (shown and shown["id"]) == verdict
