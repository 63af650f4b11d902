"""What the hook records, and when (runs inside every training rank; stdlib only).

The patched torch calls report events here, from the training threads. They only update this
rank's progress in Python objects: the hook's publisher thread copies it into the beacon several
times a second (`publish`), so a training step pays for a few list stores, not for a shared
record's lock and seqlock. The beacon lags by at most one publish interval, and a rank blocked
in a collective has released the GIL to the publisher. An implicit collective (DDP's backward
all-reduce) and an async one stay pending until this rank's next event, because nothing in
Python sees them finish. No method raises: a fault in recording disables it and removes the
beacon, so the agent falls back to treating the rank as one without a hook instead of reading a
beacon that silently stopped.

A process that is not a rank yet (launched without RANK, as `torch.multiprocessing.spawn` starts
them) holds an *armed* recorder: no beacon, recording nothing, until `start` gives it one when
the process calls init_process_group with its rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from watchdog.beacon import (
    EXIT_CLEAN,
    MAX_GROUPS,
    NO_SETUP,
    NOT_ENTERED,
    UNTIMED,
    BeaconWriter,
    Entered,
    Identity,
    RaisedException,
    Setup,
)
from watchdog.hook.checks import CHECK_EVERY, Checks
from watchdog.hook.pace import PaceTracker

NO_PHASE = ("", 0.0, 0.0)
NO_GROUP = object()  # Recorder.ddp_group until a DDP forward: it is no group, not even None
DDP_OP = b"all_reduce"  # the op of DDP's gradient all-reduce, entered by its training forward
# Copies `progress` makes while the training thread keeps changing what it copies: the GIL
# passes between threads every few milliseconds, so a second copy is all but always whole.
MAX_COPIES = 3


class Recorder:
    """The single recorder of one rank; `enabled` is False while armed, in forked children and
    after a fault."""

    # Its attributes are read several times per training step: slots make each read one load.
    __slots__ = (
        "_completed",
        "_ddp_base",
        "_entered",
        "_manual_steps",
        "_pace",
        "_pending",
        "_phase",
        "_wait_mark",
        "check_at",
        "checks",
        "compiling_since",
        "ddp_calls",
        "ddp_done",
        "ddp_group",
        "ddp_slot",
        "enabled",
        "exit_at",
        "exit_code",
        "exited",
        "failed",
        "grad_syncs",
        "identity",
        "pid",
        "steps",
        "wait_s",
        "wait_sq",
        "writer",
    )

    def __init__(self, writer: BeaconWriter | None = None, identity: Identity | None = None,
                 checks: frozenset[str] = frozenset(), check_every: int = CHECK_EVERY) -> None:
        """A recorder writing to `writer`, or an armed one (neither given) until `start`."""
        self.writer = writer
        self.identity = identity
        self.pid = identity.pid if identity is not None else os.getpid()
        self.enabled = writer is not None
        self.failed = False
        self.exited = False
        self.exit_code = 0  # what the main thread asked sys.exit for: atexit is not told
        self.exit_at = 0.0  # when it asked: atexit runs after torch's own exit handlers
        # Indexed by beacon slot; each item is replaced whole, so the publisher reads it whole.
        self._entered: list[Entered] = [NOT_ENTERED] * MAX_GROUPS
        # slot -> seq of the last collective completed; and (slot, seq) of the one collective
        # waiting for this rank's next event, since each event completes the one before.
        self._completed: dict[int, int] = {}
        self._pending: tuple[int, int] | None = None
        self.steps = 0  # optimizer steps (or watchdog.step() calls) counted
        self._manual_steps = False
        self._phase = NO_PHASE
        self._pace = PaceTracker()  # fed by each publish
        self.checks = Checks(checks, check_every, self.steps_taken)  # of CHECK_NAMES
        self.check_at = self.checks.first_check  # the step count at which checks next run
        # collectives seen that synchronize gradients (or split the model), DDP's counted apart
        self.grad_syncs = 0
        self.compiling_since = 0.0  # when the compile under way began (torch.compile); 0: none
        # The process group of the last DDP forward, and its slot: a step finds it by identity,
        # with no hash and no dict, since in a step each object touched costs (see `enter`).
        self.ddp_group: object = NO_GROUP
        self.ddp_slot = -1
        # That group's all-reduces are counted, not entered one by one (`ddp_all_reduce`):
        # `ddp_calls` so far, of which the first `ddp_done` are complete; `_ddp_base` is
        # (slot, its seq, ddp_calls) when the count was last folded into its entries, one tuple
        # so that the publisher never reads a seq and its count from two different folds.
        self.ddp_calls = self.ddp_done = 0
        self._ddp_base = (-1, 0, 0)
        # Seconds spent inside blocking collectives and DDP's backward: who waits least is
        # whom the others wait for (straggler detection compares it across ranks).
        self.wait_s = 0.0
        # each step's wait squared, summed: a deficit spread over most steps is a straggler's,
        # one concentrated in a few is a periodic phase's
        self.wait_sq = self._wait_mark = 0.0

    def start(self, writer: BeaconWriter, identity: Identity,
              checks: frozenset[str] = frozenset(), check_every: int = CHECK_EVERY) -> None:
        """Begin recording an armed process as the rank `identity` names, with those checks."""
        self.writer, self.identity, self.pid = writer, identity, identity.pid
        self.checks.configure(checks, check_every)
        self.check_at = self.checks.first_check
        self.enabled = True

    def could_not_start(self) -> None:
        """An armed process that could not become its rank (the caller said why): it records
        nothing, for good, and tries no more."""
        self.failed = True

    def forked(self) -> None:
        """This process is a forked child of the rank (a DataLoader worker): it shares the
        rank's beacon mapping, so it must not write."""
        self.enabled = False
        self.checks.losses.watching = False  # backward() reads only this flag

    def fail(self, error: BaseException) -> None:
        """Stop recording for good after an internal error, and say so once."""
        if self.failed:
            return
        self.enabled = False
        self.checks.losses.stop()
        self.failed = True
        print(f"torch-hang-watchdog: hook disabled after an internal error: {error!r}",
              file=sys.stderr)
        if self.writer is not None:
            with contextlib.suppress(OSError):
                self.writer.remove()

    # DDP's forward and optimizer_stepped() run in every training step, right after the rank
    # waited in a collective: with cold caches each Python call, and each object touched, costs
    # a good part of a microsecond there, so they call no helper of their own, the wrappers
    # read `steps` and count `grad_syncs` without a call, and DDP's all-reduce is a count, which
    # counts as a gradient sync too.
    def enter(self, slot: int, op: bytes) -> int:
        """Record entering the next collective of group `slot`; returns its seq (0 on a fault)."""
        try:
            waiting = self._pending
            if waiting is not None:
                self._completed[waiting[0]] = waiting[1]
                self._pending = None
            if self.ddp_calls != self._ddp_base[2]:
                self._fold_ddp_calls()
            seq = self._entered[slot][0] + 1
            self._entered[slot] = (seq, op, time.time())
            if slot == self._ddp_base[0]:  # DDP's later all-reduces count on from this one
                self._ddp_base = (slot, seq, self.ddp_calls)
            return seq
        except Exception as e:
            self.fail(e)
            return 0

    def ddp_all_reduce(self, group: object, slot: int) -> None:
        """A DDP training forward on `group` (beacon slot `slot`): it enters the gradients'
        all-reduce, which Python never sees end, so it completes at this rank's next event.
        Counted: the next event or publish folds the count into the group's entries, and the
        publisher times the entry when first published, which spares every step a clock read.
        DDP's forward wrapper does the first branch itself, without a call."""
        if group is self.ddp_group and self._pending is None:
            self.ddp_calls += 1
            return
        try:
            waiting = self._pending
            if waiting is not None:
                self._completed[waiting[0]] = waiting[1]
                self._pending = None
            self._fold_ddp_calls()
            if group is not self.ddp_group:
                self.ddp_group, self.ddp_slot = group, slot
                self._ddp_base = (slot, self._entered[slot][0], self.ddp_calls)
            self.ddp_calls += 1
        except Exception as e:
            self.fail(e)

    def _fold_ddp_calls(self) -> None:
        """An event: DDP's all-reduces counted so far are entered and complete."""
        slot, seq, folded = self._ddp_base
        calls = self.ddp_calls
        if calls != folded:
            seq += calls - folded
            self._entered[slot] = (seq, DDP_OP, UNTIMED)
            self._completed[slot] = seq
            self._ddp_base = (slot, seq, calls)
        self.ddp_done = calls

    def progress(self) -> tuple[list[Entered], dict[int, int]]:
        """Copies of each group's last entry and last completed seq, DDP's all-reduces counted
        since the last fold included: what the publisher writes. A fold, or an entry on DDP's
        group, while copying gives a new `_ddp_base`: then it copies again (MAX_COPIES times),
        so that a seq and the count added to it come from one fold and no publish is behind
        the one before it. Should every copy be torn, the last one is used: never ahead of the
        rank, one collective behind at most."""
        for _ in range(MAX_COPIES):
            base = self._ddp_base
            completed = self._completed.copy()  # first: entries copied after it are not behind
            entered = self._entered[:]
            calls, done = self.ddp_calls, self.ddp_done
            if self._ddp_base is base:
                break
        slot, seq, folded = base
        if slot >= 0 and calls != folded:
            top = seq + calls - folded
            entered[slot] = (top, DDP_OP, UNTIMED)
            completed[slot] = top if done >= calls else top - 1
        return entered, completed

    def grad_synced(self) -> None:
        """A collective that synchronizes gradients, or splits the model across ranks, was
        called (the NO_GRAD_SYNC check counts the steps without one)."""
        self.grad_syncs += 1

    def complete(self, slot: int, seq: int) -> None:
        self._completed[slot] = seq
        self.wait_s += time.time() - self._entered[slot][2]  # by the clock enter() read

    def waited(self, ends: tuple[tuple[int, int], ...]) -> None:
        """Async collectives or transfers whose wait() returned: completed, unless their group
        completed a later one already."""
        for slot, seq in ends:
            if self._completed.get(slot, 0) < seq:
                self._completed[slot] = seq
            if self._pending == (slot, seq):
                self._pending = None

    def leave_pending(self, slot: int, seq: int) -> None:
        """Treat the collective just entered as pending after all (an async one)."""
        self._pending = (slot, seq)

    def optimizer_stepped(self, optimizer: object, _args: object = None,
                          _kwargs: object = None) -> None:
        """An optimizer stepped (patches/optimizer.py, or a global optimizer step hook): counts
        a step, unless `watchdog.step()` counts them, so a loop with several optimizers, or
        with both, counts each step once."""
        if self.enabled:
            if not self._manual_steps:
                self.steps += 1
            waited = self.wait_s - self._wait_mark
            self._wait_mark, self.wait_sq = self.wait_s, self.wait_sq + waited * waited
            self.ddp_done = self.ddp_calls
            waiting = self._pending
            if waiting is not None:
                self._completed[waiting[0]] = waiting[1]
                self._pending = None
            if self.steps >= self.check_at:
                self._check(optimizer)

    def run_check(self, check: Callable[..., None], *args: Any) -> None:
        """Run a check from the training thread: its fault disables the hook, never the job."""
        try:
            check(*args)
        except Exception as e:
            self.fail(e)

    def _check(self, optimizer: object) -> None:
        try:
            self.check_at = self.checks.stepped(self.steps, optimizer)
        except Exception as e:
            self.fail(e)

    def steps_taken(self) -> int:
        return self.steps

    def step(self) -> None:
        """Count a training step by hand; from now on optimizer steps are not counted."""
        if self.enabled:
            self._manual_steps = True
            self.optimizer_stepped(None)
            self.steps += 1

    def compile_started(self) -> None:
        """torch.compile began compiling (a frame, or a backward it compiles on first use):
        published as work under way, since now, until `compile_ended`."""
        self.compiling_since = time.time()

    def compile_ended(self) -> None:
        self.compiling_since = 0.0

    def publish(self) -> None:
        """Copy the progress recorded so far into the beacon, with a fresh liveness stamp."""
        writer = self.writer
        if not self.enabled or writer is None:
            return
        try:
            entered, completed = self.progress()
            steps = self.steps
            now = time.time()
            # the beacon's event count (BeaconSnapshot.events), groups joined included
            events = (steps + writer.n_groups + sum(seq for seq, _, _ in entered)
                      + sum(completed.values()))
            pace = self._pace.observe(events, steps, now)
            checks = self.checks.collect(steps, self.grad_syncs + self.ddp_calls)
            writer.publish(steps, entered, completed, now, pace, checks,
                           progress_at=self._pace.progress_at,
                           compiling_since=self.compiling_since, waited=(self.wait_s, self.wait_sq))
            writer.heartbeat(now)
        except Exception as e:
            self.fail(e)

    def read_losses(self) -> None:
        """Read the losses kept so far, between publishes (hook/losses.py)."""
        if self.enabled:
            try:
                self.checks.read_losses()
            except Exception as e:
                self.fail(e)

    def set_phase(self, phase: tuple[str, float, float]) -> tuple[str, float, float]:
        """Declare (name, started, timeout) as the current phase; returns the one it replaces."""
        previous = self._phase
        if not self.enabled or self.writer is None:
            return previous
        try:
            self.writer.set_phase(*phase)
            self._phase = phase
        except Exception as e:
            self.fail(e)
        return previous

    @property
    def phase_ends(self) -> float:
        """When the current phase's time runs out (its start for none, or for one with none)."""
        _name, started, timeout = self._phase
        return started + timeout

    def set_setup(self, setup: Setup = NO_SETUP) -> None:
        """Declare the process-group set-up call this rank waits in (NO_SETUP: none now)."""
        if self.enabled and self.writer is not None:
            try:
                self.writer.set_setup(setup)
            except Exception as e:
                self.fail(e)

    def set_rank(self, rank: int, world_size: int) -> None:
        """Adopt the rank and world size torch.distributed settled on."""
        identity, writer = self.identity, self.writer
        if identity is None or writer is None or (rank, world_size) == (
                identity.rank, identity.world_size):
            return
        try:
            self.identity = dataclasses.replace(identity, rank=rank, world_size=world_size)
            writer.write_identity(self.identity)
        except Exception as e:
            self.fail(e)

    def note_exit(self, code: int) -> None:
        """sys.exit(code) was called in the main thread: the exit is timed now, not at atexit,
        which runs after torch's own exit handlers have already dropped the peers' connections.
        A later call replaces both."""
        self.exit_code, self.exit_at = code, time.time()

    def mark_shutdown(self) -> None:
        """Record the interpreter's orderly exit (atexit), with the code sys.exit asked for."""
        self.mark_exit(EXIT_CLEAN, self.exit_code)

    def mark_exit(self, state: int, code: int, raised: RaisedException | None = None) -> None:
        """Record how the process ended; only the first call counts (excepthook or sys.exit
        with an exception in hand, then atexit)."""
        writer = self.writer
        if not self.enabled or writer is None or self.exited or os.getpid() != self.pid:
            return
        self.exited = True
        self.publish()
        try:
            writer.mark_exit(state, code, self.exit_at or time.time(), raised)
        except Exception as e:
            self.fail(e)
