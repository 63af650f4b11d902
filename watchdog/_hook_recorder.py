"""What the hook records, and when (runs inside every training rank; stdlib only).

The patched torch calls report events here; this turns them into beacon writes. An implicit
collective (DDP's backward all-reduce) and an async one stay pending until this rank's next
event, because nothing in Python sees them finish. No method raises: a fault in recording
disables it and removes the beacon, so the agent falls back to treating the rank as one
without a hook instead of reading a beacon that silently stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

from watchdog._beacon import BeaconWriter, Identity

NO_PHASE = ("", 0.0, 0.0)


class Recorder:
    """The single recorder of one rank; `enabled` is False in forked children and after a fault."""

    # Its attributes are read several times per training step: slots make each read one load.
    __slots__ = (
        "_manual_steps",
        "_pending",
        "_phase",
        "_steps",
        "enabled",
        "exited",
        "failed",
        "identity",
        "pid",
        "writer",
    )

    def __init__(self, writer: BeaconWriter, identity: Identity) -> None:
        self.writer = writer
        self.identity = identity
        self.pid = identity.pid
        self.enabled = True
        self.failed = False
        self.exited = False
        self._pending: list[tuple[int, int]] = []  # (slot, seq) waiting for the next event
        self._steps = 0
        self._manual_steps = False
        self._phase = NO_PHASE

    def fail(self, error: BaseException) -> None:
        """Stop recording for good after an internal error, and say so once."""
        if self.failed:
            return
        self.enabled = False
        self.failed = True
        print(f"torch-hang-watchdog: hook disabled after an internal error: {error!r}",
              file=sys.stderr)
        with contextlib.suppress(OSError):
            os.unlink(self.writer.path)

    def enter(self, slot: int, op: bytes) -> int:
        """Record entering the next collective of group `slot`; returns its seq (0 on a fault)."""
        try:
            if self._pending:
                self._complete_pending()
            return self.writer.enter(slot, op, time.time())
        except Exception as e:
            self.fail(e)
            return 0

    def complete(self, slot: int, seq: int) -> None:
        try:
            self.writer.complete(slot, seq)
        except Exception as e:
            self.fail(e)

    def enter_pending(self, slot: int, op: bytes) -> None:
        """Record a collective whose end Python never sees: it completes at the next event."""
        self.leave_pending(slot, self.enter(slot, op))

    def leave_pending(self, slot: int, seq: int) -> None:
        self._pending.append((slot, seq))

    def _complete_pending(self) -> None:
        for slot, seq in self._pending:
            self.writer.complete(slot, seq)
        self._pending.clear()

    def step(self, manual: bool) -> None:
        """Count a training step. Once `watchdog.step()` is used, optimizer steps stop counting,
        so a loop with several optimizers, or with both, counts each step once."""
        if not self.enabled:
            return
        try:
            if manual:
                self._manual_steps = True
            if manual or not self._manual_steps:
                self._steps += 1
                self.writer.step(self._steps, time.time(), self._pending)
                self._pending.clear()
            elif self._pending:
                self._complete_pending()
        except Exception as e:
            self.fail(e)

    def set_phase(self, phase: tuple[str, float, float]) -> tuple[str, float, float]:
        """Declare (name, started, timeout) as the current phase; returns the one it replaces."""
        previous = self._phase
        if not self.enabled:
            return previous
        try:
            self.writer.set_phase(*phase)
            self._phase = phase
        except Exception as e:
            self.fail(e)
        return previous

    def set_rank(self, rank: int, world_size: int) -> None:
        """Adopt the rank and world size torch.distributed settled on."""
        if (rank, world_size) == (self.identity.rank, self.identity.world_size):
            return
        try:
            self.identity = dataclasses.replace(self.identity, rank=rank, world_size=world_size)
            self.writer.write_identity(self.identity)
        except Exception as e:
            self.fail(e)

    def mark_exit(self, state: int, code: int) -> None:
        """Record how the process ended; only the first call counts (excepthook, then atexit)."""
        if not self.enabled or self.exited or os.getpid() != self.pid:
            return
        self.exited = True
        try:
            self.writer.mark_exit(state, code, time.time())
        except Exception as e:
            self.fail(e)
