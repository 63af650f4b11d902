"""The single writer of a rank's beacon, in the hook (stdlib only).

Consistency between the two processes comes from a seqlock: the writer makes the sequence
counter odd, writes, and makes it even again; a reader retries until it copied the record
between two identical even counter values. The heartbeat sits outside the seqlock: it is one
aligned 8-byte store, which cannot tear. That store, the counter's and the progress fields go
through a memoryview: `struct.pack_into` zeroes its target before writing it byte by byte, so a
reader could catch a 0 there. The writer refuses a big-endian host, where the native stores
would disagree with the little-endian layout.
"""

from __future__ import annotations

import mmap
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType

from watchdog import beacondir
from watchdog.beacon import layout
from watchdog.beacon.records import (
    CheckState,
    Environment,
    Identity,
    Pace,
    RaisedException,
    Setup,
)
from watchdog.errors import BeaconError

Entered = tuple[int, bytes, float]  # a group's last collective entered: seq, op, unix time
NOT_ENTERED: Entered = (0, b"", 0.0)
UNTIMED = 0.0  # an entry's time when the writer is to stamp it: `publish` does, when first seen


def beacon_path(beacon_dir: str, job_id: str, rank: int, pid: int) -> str:
    safe_job = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:64] or "job"
    return os.path.join(beacon_dir, f"{safe_job}.rank{rank}.pid{pid}.beacon")


class _Seqlock:
    """The writer's side of the seqlock, and the lock between the hook's threads. A write that
    raises leaves the counter odd: readers then refuse the half-written record for good."""

    __slots__ = ("_lock", "_seq", "_words")

    def __init__(self, words: memoryview) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._words = words

    def _bump(self) -> None:
        self._seq += 1
        self._words[layout.OFF_SEQ // 8] = self._seq

    def __enter__(self) -> None:
        self._lock.acquire()
        self._bump()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            self._bump()
        self._lock.release()


def _cut(text: str, size: int) -> bytes:
    return text.encode()[:size]


def _pack_identity(buf: mmap.mmap, identity: Identity) -> None:
    layout.IDENTITY.pack_into(
        buf, layout.OFF_IDENTITY, identity.pid, identity.rank, identity.local_rank,
        identity.world_size, identity.created_at, _cut(identity.job_id, 64),
        _cut(identity.host, 64))
    layout.ATTEMPT.pack_into(buf, layout.OFF_START, max(0, identity.attempt))


def _pack_setup(buf: mmap.mmap, setup: Setup) -> None:
    layout.SETUP.pack_into(buf, layout.OFF_SETUP, _cut(setup.call, 24), setup.entered_at,
                           _cut(setup.rendezvous, 128))


def _pack_group(buf: mmap.mmap, slot: int, name: str, ranks: tuple[int, ...],
                world_size: int) -> None:
    """A new group's name and members; its hot fields are publish()'s."""
    listed = ranks[:layout.MAX_LISTED_RANKS]
    n_listed = layout.ALL_WORLD if ranks == tuple(range(world_size)) else len(listed)
    base = layout.group_base(slot)
    layout.GROUP_META.pack_into(buf, base, _cut(name, 32), len(ranks), n_listed)
    layout.RANKS.pack_into(buf, base + layout.OFF_RANKS, *listed,
                           *([0] * (layout.MAX_LISTED_RANKS - len(listed))))
    layout.N_GROUPS.pack_into(buf, layout.OFF_N_GROUPS, slot + 1)


def _pack_checks(buf: mmap.mmap, checks: CheckState) -> None:
    prints = checks.fingerprints[-layout.MAX_FINGERPRINTS:]
    mask = sum(1 << layout.CHECK_NAMES.index(name) for name in checks.enabled)
    layout.CHECKS.pack_into(
        buf, layout.OFF_CHECKS, mask, len(prints), checks.taken, checks.unsynced_steps,
        checks.sampler_reuses, checks.sampler_reuse_step, checks.sampler_epoch,
        checks.ddp_change_step, checks.ddp_change_module, _cut(checks.ddp_change_group, 32),
        _cut(checks.ddp_change, 64), checks.nonfinite_step + 1,
        checks.nonfinite_value)
    for n, fp in enumerate(prints):
        layout.FINGERPRINT.pack_into(buf, layout.OFF_FINGERPRINTS + n * layout.FINGERPRINT.size,
                                     layout.FINGERPRINT_OF.index(fp.of) + 1, fp.module, fp.step,
                                     fp.digest, _cut(fp.group, 32))


def _pack_environment(buf: mmap.mmap, env: Environment) -> None:
    layout.ENVIRONMENT.pack_into(
        buf, layout.OFF_ENVIRONMENT, env.world_size, env.group_device + 1, env.module_device + 1,
        _cut(env.backend, 32), _cut(env.torch, 32), _cut(env.cuda, 16), _cut(env.nccl, 16),
        _cut(env.python, 16), _cut(env.watchdog, 16),
        _cut(env.visible_devices, layout.MAX_VISIBLE_DEVICES))


def _pack_exit(buf: mmap.mmap, state: int, code: int, now: float, reason: bytes) -> None:
    layout.EXIT.pack_into(buf, layout.OFF_EXIT, state, code, now)
    buf[layout.OFF_REASON:layout.OFF_REASON + len(reason)] = reason
    layout.REASON_LEN.pack_into(buf, layout.OFF_REASON_LEN, len(reason))


class _Stores:
    """The progress fields, stored one aligned word at a time (see the module's docstring)."""

    __slots__ = ("bytes", "doubles", "words")

    def __init__(self, buf: mmap.mmap) -> None:
        self.bytes = memoryview(buf)
        self.words = self.bytes.cast("Q")
        self.doubles = self.bytes.cast("d")

    def pace(self, progress_at: float, pace: Pace) -> None:
        self.doubles[layout.OFF_PACE // 8] = progress_at
        self.doubles[layout.OFF_PACE // 8 + 1] = pace.gap_p99
        self.words[layout.OFF_PACE // 8 + 2] = pace.gaps

    def compiling(self, since: float) -> None:
        self.doubles[layout.OFF_COMPILING // 8] = since

    def steps(self, steps: int, now: float) -> None:
        self.words[layout.OFF_PROGRESS // 8] = steps
        self.doubles[layout.OFF_PROGRESS // 8 + 1] = now

    def op(self, slot: int, op: bytes) -> None:
        base = layout.group_base(slot)
        self.bytes[base + layout.OFF_OP:base + layout.OFF_ENTERED_SEQ] = op[:24].ljust(24, b"\0")

    def group(self, slot: int, entered: Entered, completed: int, now: float) -> None:
        """An UNTIMED entry keeps the time already stored for its seq, or is stamped `now`."""
        seq, _, entered_at = entered
        base = layout.group_base(slot)
        seq_word = (base + layout.OFF_ENTERED_SEQ) // 8
        at_double = (base + layout.OFF_ENTERED_AT) // 8
        if entered_at == UNTIMED:
            entered_at = self.doubles[at_double] if seq == self.words[seq_word] else now
        self.words[seq_word] = seq
        self.doubles[at_double] = entered_at
        self.words[(base + layout.OFF_COMPLETED) // 8] = completed

    def release(self) -> None:
        self.words.release()
        self.doubles.release()
        self.bytes.release()


def _map_new(dir_fd: int, name: str) -> mmap.mmap:
    """A new beacon file, mapped; its descriptor is closed again (the mapping needs none)."""
    fd = beacondir.create_beacon_file(dir_fd, name, layout.SIZE)
    try:
        return mmap.mmap(fd, layout.SIZE)
    finally:
        os.close(fd)


class BeaconWriter:
    """The single writer of one rank's beacon. Not for forked children: see `hook.lifecycle`."""

    __slots__ = ("_dir_fd", "_lock", "_mm", "_name", "_ops", "_own_dir_fd", "_slots", "_steps",
                 "_stores", "path")

    def __init__(self, path: str, identity: Identity, dir_fd: int | None = None) -> None:
        """Create the beacon at `path` (its name only, within the directory `dir_fd`, when
        given), its space reserved: BeaconError when it cannot be (a full /dev/shm)."""
        if sys.byteorder != "little":
            raise BeaconError("beacons are little-endian; this host is not")
        self.path = path
        self._name = os.path.basename(path)
        self._own_dir_fd = dir_fd is None
        self._dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY
                               | os.O_CLOEXEC) if dir_fd is None else dir_fd
        try:
            self._mm = _map_new(self._dir_fd, self._name)
        except BaseException:
            self._close_dir()
            raise
        self._stores = _Stores(self._mm)
        self._lock = _Seqlock(self._stores.words)
        self._slots: dict[str, int] = {}
        self._ops: list[bytes] = []  # each registered slot's op as last written
        self._steps = 0
        self.write_identity(identity)
        # last: readers see a whole record
        layout.HEADER.pack_into(self._mm, 0, layout.MAGIC, layout.VERSION, layout.SIZE)
        beacondir.publish_beacon_file(self._dir_fd, self._name)

    def write_identity(self, identity: Identity) -> None:
        with self._lock:
            _pack_identity(self._mm, identity)

    @property
    def n_groups(self) -> int:
        return len(self._ops)

    def set_setup(self, setup: Setup) -> None:
        with self._lock:
            _pack_setup(self._mm, setup)

    def group_slot(self, name: str, ranks: tuple[int, ...], world_size: int) -> int:
        """The slot of group `name`, registered on first use; -1 once all slots are taken."""
        slot = self._slots.get(name)
        if slot is not None:
            return slot
        with self._lock:
            slot = len(self._ops)
            if slot >= layout.MAX_GROUPS:
                return -1
            _pack_group(self._mm, slot, name, ranks, world_size)
            self._ops.append(b"")
            self._slots[name] = slot
            return slot

    def publish(self, steps: int, entered: Sequence[Entered], completed: Mapping[int, int],
                now: float, pace: Pace | None = None, checks: CheckState | None = None,
                progress_at: float = 0.0, compiling_since: float = 0.0,
                waited: tuple[float, float] = (0.0, 0.0)) -> None:
        """Record the rank's progress as one consistent record: the step count (stamped `now`
        when it changed) and, for each registered group, its last collective entered as
        (seq, op, time) and its last completed seq. An UNTIMED entry is stamped `now` by the
        first publish that sees its seq. `pace`, where given, replaces the pace and when the
        rank last progressed; `checks`, where given, replaces the checks' state;
        `compiling_since` is when the compile under way began (0: none); `waited`, the seconds
        spent inside collectives so far and the sum of each step's, squared."""
        stores = self._stores
        with self._lock:
            stores.compiling(compiling_since)
            at = layout.OFF_WAITED // 8
            stores.doubles[at], stores.doubles[at + 1] = waited
            if checks is not None:
                _pack_checks(self._mm, checks)
            if pace is not None:
                stores.pace(progress_at, pace)
            if steps != self._steps:
                stores.steps(steps, now)
                self._steps = steps
            for slot, op_written in enumerate(self._ops):
                op = entered[slot][1]
                if op != op_written:
                    stores.op(slot, op)
                    self._ops[slot] = op
                stores.group(slot, entered[slot], completed.get(slot, 0), now)

    def set_environment(self, env: Environment) -> None:
        with self._lock:
            _pack_environment(self._mm, env)

    def set_phase(self, name: str, started: float, timeout: float) -> None:
        with self._lock:
            layout.PHASE.pack_into(self._mm, layout.OFF_PHASE, _cut(name, 32), started,
                                   timeout)

    def mark_exit(self, state: int, code: int, now: float,
                  raised: RaisedException | None = None) -> None:
        """How the process ends; an exception record that does not fit is left out whole."""
        reason = raised.encode() if raised is not None else b""
        if len(reason) > layout.MAX_EXIT_REASON:
            reason = b""
        with self._lock:
            _pack_exit(self._mm, state, code, now, reason)

    def heartbeat(self, now: float) -> None:
        self._stores.doubles[layout.OFF_HEARTBEAT // 8] = now

    def remove(self) -> None:
        """Delete the beacon file (through its directory's descriptor: never another file)."""
        os.unlink(self._name, dir_fd=self._dir_fd)

    def close(self) -> None:
        self._stores.release()
        self._mm.close()
        self._close_dir()

    def _close_dir(self) -> None:
        if self._own_dir_fd:
            os.close(self._dir_fd)
            self._own_dir_fd = False
