"""A job's whole life in the coordinator: phases never enter the pace, and start-up is judged on
evidence. Each case plays a 4-rank DDP job's reports through a JobView (times are arguments),
the rank states shaped like those of watchdog/demo/train.py under gloo."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tests.helpers.builders import (
    DATA_STALL,
    DDP_BACKWARD,
    IN_RENDEZVOUS,
    PREPARING,
    T0,
    done,
    entered,
    joining,
    judgement,
    rank,
)
from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.judgement import early_verdict_stands
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.verdict import decide
from watchdog.model import Activity, Frame, Kind, Pace, RankStack, RankState

POLICY = StallPolicy()  # the defaults a user gets: floor 10 s, k 5, warm-up 60 s
TICK = 0.25  # `watchdog run`'s report interval
COMPUTING = Activity(window=3.0, main_cpu=0.98, process_cpu=1.0)
WRITING = Activity(window=3.0, main_cpu=0.2, process_cpu=0.2, write_rate=41e6)
IDLE = Activity(window=3.0)


class Life:
    """One job's reports, a tick at a time: `train` moves every rank on, `quiet` holds them."""

    def __init__(self) -> None:
        self.job = JobView("job", POLICY)
        self.now = T0
        self.events = 100
        self.report(lambda r: rank(r, done(1, 0.0), steps=1, events=self.events))

    def report(self, state_of: Callable[[int], RankState]) -> None:
        for r in range(4):
            self.job.update(f"node-{r // 2}", state_of(r), received=self.now)
        self.job.observe(self.now)

    def train(self, seconds: float) -> None:
        """Steps as fast as reports come, every rank in DDP's all-reduce or out of it."""
        for _ in range(round(seconds / TICK)):
            self.now += TICK
            self.events += 4
            self.report(self.same(progress_age=0.0))

    def quiet(self, seconds: float, state_of: Callable[[int], RankState]) -> None:
        """No rank progresses for `seconds`; each reports what `state_of(rank)` says."""
        for _ in range(round(seconds / TICK)):
            self.now += TICK
            self.report(state_of)

    def same(self, **changes: object) -> Callable[[int], RankState]:
        """Every rank as it stands after its last step, with `changes`."""
        seq, events = self.events // 4, self.events
        return lambda r: rank(r, done(seq, 0.0), steps=seq, events=events, **changes)

    def threshold(self) -> float:
        return self.job.threshold()


def test_an_evaluation_on_every_rank_never_enters_the_pace() -> None:
    life = Life()
    life.train(20.0)
    assert life.threshold() == POLICY.floor
    life.quiet(30.0, life.same(activity=COMPUTING))  # every rank evaluates: no collective
    life.train(1.0)
    assert life.threshold() == POLICY.floor


def test_a_checkpoint_on_rank_0_while_the_others_wait_never_enters_the_pace() -> None:
    life = Life()
    life.train(20.0)
    seq = life.events // 4

    def checkpoint(r: int) -> RankState:
        if r == 0:
            return rank(0, done(seq, 0.0), steps=seq, events=life.events, activity=WRITING)
        return rank(r, entered(seq + 1, 0.0, op="barrier"), steps=seq, events=life.events,
                    activity=IDLE)

    life.quiet(8.0, checkpoint)  # under the floor: never judged, still a phase
    life.train(10.0)
    life.quiet(30.0, checkpoint)
    life.train(1.0)
    assert life.threshold() == POLICY.floor


def test_evaluations_every_few_seconds_all_day_still_leave_the_pace_alone() -> None:
    life = Life()
    for _ in range(12):
        life.train(4.0)
        life.quiet(15.0, life.same(activity=COMPUTING))
    life.train(1.0)
    assert life.threshold() == POLICY.floor


def test_short_evaluations_that_recur_never_enter_the_pace() -> None:
    """Every 2 s of training, every rank evaluates for 3 s: under the old 4 s look, such
    spells were the pace (5 x 3 s). The agent measures each rank's activity from its own last
    progress, a little before the job's last (ranks end a step a moment apart): a look at 1.5 s
    in sees the evaluation, and the threshold stays at the floor."""
    life = Life()
    for _ in range(12):
        life.train(2.0)
        began = life.now
        for _ in range(round(3.0 / TICK)):
            life.now += TICK
            since = life.now - began
            # its readings since its own progress, once they span half a second
            window = since + 0.1 if since + 0.1 >= 0.5 else 3.0
            life.report(life.same(activity=dataclasses.replace(COMPUTING, window=window),
                                  progress_age=since + 0.3))
    life.train(1.0)
    assert life.threshold() == POLICY.floor


def test_phases_count_toward_the_gaps_that_replace_the_hooks_pace() -> None:
    """A short evaluation every 2 steps: between phases the coordinator keeps a gap or two of
    training, fewer than 8 in all, while each hook's own pace holds every evaluation (5 s).
    The phases seen count toward enough gaps: the training's own set the threshold, not the
    hooks' (25 s)."""
    life = Life()
    hooks = Pace(gap_p99=5.0, gaps=40)
    for _ in range(4):
        life.train(0.5)
        life.quiet(5.0, life.same(activity=COMPUTING, pace=hooks))
    life.train(0.5)
    life.report(life.same(pace=hooks))
    assert life.job.hook_p99 == 5.0 and len(life.job.tracker._gaps) < POLICY.min_samples
    assert life.threshold() == POLICY.floor


def test_a_recompile_inside_ddps_forward_never_enters_the_pace() -> None:
    """Every rank compiles a new shape for 8 s, inside DDP's forward (all-reduce pending by
    its hook), twelve times: no step of training, so never the pace."""
    life = Life()
    for _ in range(12):
        life.train(4.0)
        seq = life.events // 4

        def compiling(r: int, seq: int = seq) -> RankState:
            return rank(r, entered(seq + 1, 0.0), steps=seq, events=life.events,
                        activity=IDLE, compile_age=1.0)  # waiting for the C++ compiler

        life.quiet(8.0, compiling)
    life.train(1.0)
    assert life.threshold() == POLICY.floor


def test_a_slow_read_on_every_step_is_the_rhythm_and_raises_the_threshold() -> None:
    """Ranks idle outside any collective (a slow filesystem): not a phase, so it is the pace,
    once it came back three times (one long gap alone is an event)."""
    life = Life()
    life.train(5.0)
    for _ in range(2):
        life.quiet(4.5, life.same(activity=IDLE))
        life.train(TICK)
    assert life.threshold() == POLICY.floor
    for _ in range(6):
        life.quiet(4.5, life.same(activity=IDLE))
        life.train(TICK)
    assert life.threshold() == POLICY.k * (4.5 + TICK)  # quiet, then the next step


def test_a_declared_phase_never_enters_the_pace() -> None:
    life = Life()
    life.train(10.0)
    for _ in range(4):
        life.quiet(5.0, life.same(activity=IDLE, phase="eval", phase_age=1.0,
                                  phase_timeout=600.0))
        life.train(2.0)
    assert life.threshold() == POLICY.floor


def test_a_stall_past_the_threshold_that_ended_by_itself_never_enters_the_pace() -> None:
    life = Life()
    life.train(10.0)
    for _ in range(4):
        life.quiet(12.0, life.same(activity=IDLE))  # judged at 10 s; then it moved on
        life.train(2.0)
    assert life.threshold() == POLICY.floor


def test_the_jobs_own_gaps_replace_the_hooks_once_known() -> None:
    """The hooks' pace is each rank's alone and counts every gap it saw, phases included: it
    starts the threshold off, and the job's own gaps take over as soon as there are enough."""
    job = JobView("job", POLICY)
    job.update("node-0", rank(0, done(1, 0.0), steps=3, pace=Pace(gap_p99=30.0, gaps=4)),
               received=T0)
    job.observe(T0)
    assert job.threshold() == 150.0
    for tick in range(1, POLICY.min_samples + 1):
        job.update("node-0", rank(0, done(1, 0.0), steps=3 + tick, events=200 + tick,
                                  pace=Pace(gap_p99=30.0, gaps=4), progress_age=0.0),
                   received=T0 + tick)
        job.observe(T0 + tick)
    assert job.threshold() == POLICY.floor


# --- start-up --------------------------------------------------------------------------------


def warming(*states: RankState, at: float = T0) -> JobView:
    job = JobView("job", POLICY)
    for state in states:
        job.update("node-0", state, received=at)
    job.observe(at)
    return job


IN_DDP_INIT = (
    Frame("_sync_module_states", "/opt/venv/lib/python3.11/site-packages/torch/distributed/"
          "utils.py", 294),
    Frame("__init__", "/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py",
          835),
    Frame("build_model", "/home/ml/train.py", 211),
    Frame("main", "/home/ml/train.py", 250),
)
LOADING = (Frame("load_pretrained", "/home/ml/train.py", 140), Frame("main", "/home/ml/train.py",
                                                                     249))


def stacks(**frames: tuple[Frame, ...]) -> dict[int, RankStack]:
    return {int(r[1:]): RankStack(int(r[1:]), 4242, f) for r, f in frames.items()}


def early(*states: RankState, taken: dict[int, RankStack]) -> tuple[bool, Kind | None, bool]:
    """Whether the warming job is looked at once the floor passed, the verdict its stacks give,
    and whether that verdict stands before the warm-up ends."""
    job = warming(*states)
    looked = judgement().early_look(job, T0 + POLICY.floor)
    snapshot = job.snapshot(T0 + POLICY.floor, taken, stalled=True)
    verdict = decide(snapshot)
    return (looked, None if verdict is None else verdict.kind,
            verdict is not None and early_verdict_stands(snapshot, verdict))


def test_an_idle_rank_that_never_reached_init_process_group_is_named_at_the_floor() -> None:
    states = [*(joining(r) for r in range(3)), rank(3, steps=0, events=0, activity=IDLE)]
    taken = stacks(r0=IN_RENDEZVOUS, r1=IN_RENDEZVOUS, r2=IN_RENDEZVOUS, r3=PREPARING)
    assert early(*states, taken=taken) == (True, Kind.MISSING_RANKS, True)


def test_a_rank_that_works_before_joining_keeps_its_warm_up() -> None:
    states = [*(joining(r) for r in range(3)), rank(3, steps=0, events=0, activity=COMPUTING)]
    taken = stacks(r0=IN_RENDEZVOUS, r1=IN_RENDEZVOUS, r2=IN_RENDEZVOUS, r3=PREPARING)
    assert early(*states, taken=taken) == (True, Kind.RANK_BUSY, False)


def test_a_rank_idle_before_ddp_while_the_others_wait_in_its_broadcast_is_named() -> None:
    waiting = [rank(r, entered(1, 5.0, op="ddp_init"), steps=0, events=3, activity=IDLE)
               for r in (0, 1, 3)]
    stuck = rank(2, done(0, 0.0), steps=0, events=1, activity=IDLE)
    taken = stacks(r0=IN_DDP_INIT, r1=IN_DDP_INIT, r2=LOADING, r3=IN_DDP_INIT)
    assert early(*waiting, stuck, taken=taken) == (True, Kind.MISSING_RANKS, True)


def test_every_rank_computing_before_its_first_step_is_left_alone() -> None:
    states = [rank(r, done(1, 0.0), steps=0, events=3, activity=COMPUTING) for r in range(4)]
    taken = stacks(r0=DATA_STALL, r1=DATA_STALL, r2=DATA_STALL, r3=DATA_STALL)
    assert early(*states, taken=taken) == (False, None, False)  # no one waits


def test_a_rank_not_seen_yet_or_without_a_stack_keeps_the_warm_up() -> None:
    joined = [joining(r) for r in range(3)]
    assert early(*joined, taken=stacks(r0=IN_RENDEZVOUS, r1=IN_RENDEZVOUS, r2=IN_RENDEZVOUS)
                 ) == (False, Kind.MISSING_RANKS, False)  # rank 3 never reported: its node is late
    idle = rank(3, steps=0, events=0, activity=IDLE)
    assert early(*joined, idle, taken=stacks(r0=IN_RENDEZVOUS)) == (
        True, Kind.MISSING_RANKS, False)


def test_ranks_all_in_a_collective_before_the_first_step_keep_the_warm_up() -> None:
    states = [rank(r, entered(1, 5.0), steps=0, events=3, activity=IDLE) for r in range(4)]
    taken = stacks(r0=DDP_BACKWARD, r1=DDP_BACKWARD, r2=DDP_BACKWARD, r3=DDP_BACKWARD)
    assert early(*states, taken=taken) == (False, Kind.ALL_IN_COLLECTIVE, False)


def test_an_exit_stands_at_any_time() -> None:
    gone = dataclasses.replace(rank(1, steps=0, events=0), exited_at=T0 + 1, exit_code=1,
                               proc_state="")
    assert early(rank(0, steps=0, events=0), gone, taken={})[1:] == (Kind.RANK_EXITED, True)
