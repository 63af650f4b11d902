"""The beacon: a fixed-layout, versioned record in a memory-mapped file, one per rank.

Written by the hook inside the training process (one writer), read by the agent (many readers).
Stdlib only: the hook imports this module. Consistency between the two processes comes from a
seqlock: the writer makes the sequence counter odd, writes, and makes it even again; a reader
retries until it copied the record between two identical even counter values. The heartbeat
sits outside the seqlock: it is one aligned 8-byte store, which cannot tear. That store, the
counter's and the progress fields go through a memoryview: `struct.pack_into` zeroes its target
before writing it byte by byte, so a reader could catch a 0 there. The layout is little-endian;
the writer refuses a big-endian host, where the native stores would disagree.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from watchdog import beacondir
from watchdog.errors import BeaconError

MAGIC = b"THWBEACN"
VERSION = 1
MAX_GROUPS = 16
MAX_LISTED_RANKS = 256
ALL_WORLD = -1  # n_listed for a group that spans the whole world, at any size
MAX_WORLD = 1 << 20  # a larger world size in a beacon is corruption, not a job

EXIT_RUNNING, EXIT_CLEAN, EXIT_EXCEPTION = 0, 1, 2

_HEADER = struct.Struct("<8sII")  # magic, version, total size
_HEARTBEAT = struct.Struct("<d")
_IDENTITY = struct.Struct("<iiiid64s64s")  # pid, rank, local_rank, world, created_at, job, host
# steps, step_at, n_groups, exit_state, exit_code, exited_at, phase, phase_started, phase_timeout
_PROGRESS = struct.Struct("<QdIIid32sdd")
_GROUP_META = struct.Struct("<32sii")  # name, size, n_listed
_GROUP_HOT = struct.Struct("<24sQdQ")  # op, entered_seq, entered_at, completed_seq
_RANKS = struct.Struct(f"<{MAX_LISTED_RANKS}i")
_EXIT = struct.Struct("<Iid")  # exit_state, exit_code, exited_at (n_groups left alone)
_PHASE = struct.Struct("<32sdd")
_N_GROUPS = struct.Struct("<I")

OFF_SEQ = 16
OFF_HEARTBEAT = 24
OFF_IDENTITY = 32
OFF_PROGRESS = OFF_IDENTITY + _IDENTITY.size
OFF_N_GROUPS = OFF_PROGRESS + 16
OFF_EXIT = OFF_N_GROUPS + 4
OFF_PHASE = OFF_EXIT + _EXIT.size
OFF_GROUPS = 512
GROUP_SLOT_SIZE = _GROUP_META.size + _GROUP_HOT.size + _RANKS.size
# Inside a slot: the hot fields that enter() and complete() store one by one.
OFF_OP = _GROUP_META.size
OFF_ENTERED_SEQ = OFF_OP + 24
OFF_ENTERED_AT = OFF_OP + 32
OFF_COMPLETED = OFF_OP + 40
SIZE = OFF_GROUPS + MAX_GROUPS * GROUP_SLOT_SIZE

assert OFF_PROGRESS + _PROGRESS.size <= OFF_GROUPS
assert OFF_PROGRESS % 8 == OFF_GROUPS % 8 == GROUP_SLOT_SIZE % 8 == OFF_ENTERED_SEQ % 8 == 0


Entered = tuple[int, bytes, float]  # a group's last collective entered: seq, op, unix time
NOT_ENTERED: Entered = (0, b"", 0.0)
UNTIMED = 0.0  # an entry's time when the writer is to stamp it: `publish` does, when first seen


@dataclass(frozen=True)
class Identity:
    job_id: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    created_at: float


@dataclass(frozen=True)
class BeaconGroup:
    name: str
    ranks: tuple[int, ...]
    op: str
    entered_seq: int
    entered_at: float
    completed_seq: int


@dataclass(frozen=True)
class BeaconSnapshot:
    identity: Identity
    heartbeat: float
    steps: int
    step_at: float
    exit_state: int
    exit_code: int
    exited_at: float
    phase: str
    phase_started: float
    phase_timeout: float
    groups: tuple[BeaconGroup, ...]

    @property
    def events(self) -> int:
        """Monotonic count of everything recorded: it changes exactly when the rank progressed."""
        return self.steps + sum(g.entered_seq + g.completed_seq for g in self.groups)

    @property
    def last_event_at(self) -> float:
        return max([self.step_at, *(g.entered_at for g in self.groups)])


def beacon_path(beacon_dir: str, job_id: str, rank: int, pid: int) -> str:
    safe_job = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:64] or "job"
    return os.path.join(beacon_dir, f"{safe_job}.rank{rank}.pid{pid}.beacon")


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class BeaconWriter:
    """The single writer of one rank's beacon. Not for forked children: see `hook.lifecycle`."""

    __slots__ = (
        "_bytes",
        "_dir_fd",
        "_doubles",
        "_lock",
        "_mm",
        "_name",
        "_ops",
        "_own_dir_fd",
        "_seq",
        "_slots",
        "_steps",
        "_words",
        "path",
    )

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
            fd = beacondir.create_beacon_file(self._dir_fd, self._name, SIZE)
        except BaseException:
            self._close_dir()
            raise
        try:
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._bytes = memoryview(self._mm)
        self._words = self._bytes.cast("Q")  # aligned 8-byte stores
        self._doubles = self._bytes.cast("d")
        self._lock = threading.Lock()
        self._seq = 0
        self._slots: dict[str, int] = {}
        self._ops: list[bytes] = []  # each registered slot's op as last written
        self._steps = 0
        self.write_identity(identity)
        _HEADER.pack_into(self._mm, 0, MAGIC, VERSION, SIZE)  # last: readers see a whole record
        beacondir.publish_beacon_file(self._dir_fd, self._name)

    def _begin(self) -> None:
        self._seq += 1
        self._words[OFF_SEQ // 8] = self._seq

    def _end(self) -> None:
        self._seq += 1
        self._words[OFF_SEQ // 8] = self._seq

    def write_identity(self, identity: Identity) -> None:
        with self._lock:
            self._begin()
            _IDENTITY.pack_into(
                self._mm, OFF_IDENTITY, identity.pid, identity.rank, identity.local_rank,
                identity.world_size, identity.created_at, identity.job_id.encode()[:64],
                identity.host.encode()[:64],
            )
            self._end()

    def group_slot(self, name: str, ranks: tuple[int, ...], world_size: int) -> int:
        """The slot of group `name`, registered on first use; -1 once all slots are taken."""
        slot = self._slots.get(name)
        if slot is not None:
            return slot
        with self._lock:
            slot = len(self._ops)
            if slot >= MAX_GROUPS:
                return -1
            listed = ranks[:MAX_LISTED_RANKS]
            n_listed = ALL_WORLD if ranks == tuple(range(world_size)) else len(listed)
            base = OFF_GROUPS + slot * GROUP_SLOT_SIZE
            self._begin()
            _GROUP_META.pack_into(self._mm, base, name.encode()[:32], len(ranks), n_listed)
            _RANKS.pack_into(self._mm, base + _GROUP_META.size + _GROUP_HOT.size,
                             *listed, *([0] * (MAX_LISTED_RANKS - len(listed))))
            _N_GROUPS.pack_into(self._mm, OFF_N_GROUPS, slot + 1)
            self._end()
            self._ops.append(b"")
            self._slots[name] = slot
            return slot

    def publish(self, steps: int, entered: Sequence[Entered], completed: Mapping[int, int],
                now: float) -> None:
        """Record the rank's progress as one consistent record: the step count (stamped `now`
        when it changed) and, for each registered group, its last collective entered as
        (seq, op, time) and its last completed seq. An UNTIMED entry is stamped `now` by the
        first publish that sees its seq."""
        words, doubles = self._words, self._doubles
        with self._lock:
            self._begin()
            if steps != self._steps:
                words[OFF_PROGRESS // 8] = steps
                doubles[OFF_PROGRESS // 8 + 1] = now
                self._steps = steps
            for slot, op_written in enumerate(self._ops):
                seq, op, entered_at = entered[slot]
                base = OFF_GROUPS + slot * GROUP_SLOT_SIZE
                if op != op_written:
                    self._bytes[base + OFF_OP:base + OFF_ENTERED_SEQ] = op[:24].ljust(24, b"\0")
                    self._ops[slot] = op
                seq_word, at_double = (base + OFF_ENTERED_SEQ) // 8, (base + OFF_ENTERED_AT) // 8
                if entered_at == UNTIMED:
                    entered_at = doubles[at_double] if seq == words[seq_word] else now
                words[seq_word] = seq
                doubles[at_double] = entered_at
                words[(base + OFF_COMPLETED) // 8] = completed.get(slot, 0)
            self._end()

    def set_phase(self, name: str, started: float, timeout: float) -> None:
        with self._lock:
            self._begin()
            _PHASE.pack_into(self._mm, OFF_PHASE, name.encode()[:32], started, timeout)
            self._end()

    def mark_exit(self, state: int, code: int, now: float) -> None:
        with self._lock:
            self._begin()
            _EXIT.pack_into(self._mm, OFF_EXIT, state, code, now)
            self._end()

    def heartbeat(self, now: float) -> None:
        self._doubles[OFF_HEARTBEAT // 8] = now

    def remove(self) -> None:
        """Delete the beacon file (through its directory's descriptor: never another file)."""
        os.unlink(self._name, dir_fd=self._dir_fd)

    def close(self) -> None:
        self._words.release()
        self._doubles.release()
        self._bytes.release()
        self._mm.close()
        self._close_dir()

    def _close_dir(self) -> None:
        if self._own_dir_fd:
            os.close(self._dir_fd)
            self._own_dir_fd = False


def _parse(data: bytes) -> BeaconSnapshot:
    pid, rank, local_rank, world, created, job, host = _IDENTITY.unpack_from(data, OFF_IDENTITY)
    (steps, step_at, n_groups, exit_state, exit_code, exited_at, phase, phase_started,
     phase_timeout) = _PROGRESS.unpack_from(data, OFF_PROGRESS)
    if n_groups > MAX_GROUPS:
        raise BeaconError(f"beacon claims {n_groups} process groups (at most {MAX_GROUPS})")
    groups = []
    for slot in range(n_groups):
        base = OFF_GROUPS + slot * GROUP_SLOT_SIZE
        name, _size, n_listed = _GROUP_META.unpack_from(data, base)
        op, entered_seq, entered_at, completed_seq = _GROUP_HOT.unpack_from(
            data, base + _GROUP_META.size)
        if n_listed == ALL_WORLD and 0 < world <= MAX_WORLD:
            ranks = tuple(range(world))
        elif 0 <= n_listed <= MAX_LISTED_RANKS:
            ranks = _RANKS.unpack_from(data, base + _GROUP_META.size + _GROUP_HOT.size)[:n_listed]
        else:
            raise BeaconError(f"beacon group slot {slot} lists {n_listed} ranks (world {world})")
        groups.append(BeaconGroup(_text(name), tuple(ranks), _text(op), entered_seq, entered_at,
                                  completed_seq))
    identity = Identity(_text(job), rank, local_rank, world, _text(host), pid, created)
    return BeaconSnapshot(identity, _HEARTBEAT.unpack_from(data, OFF_HEARTBEAT)[0], steps,
                          step_at, exit_state, exit_code, exited_at, _text(phase), phase_started,
                          phase_timeout, tuple(groups))


def read_beacon(buf: bytes | mmap.mmap, attempts: int = 10_000) -> BeaconSnapshot:
    """A consistent snapshot of a beacon, or BeaconError if it is not one or never settles."""
    if len(buf) < SIZE:
        raise BeaconError(f"beacon is {len(buf)} bytes, expected {SIZE}")
    magic, version, recorded_size = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise BeaconError("not a torch-hang-watchdog beacon (bad magic)")
    if version != VERSION or recorded_size != SIZE:
        raise BeaconError(f"beacon version {version} size {recorded_size}; this reader knows "
                          f"version {VERSION} size {SIZE}")
    with memoryview(buf) as view, view[:SIZE] as head, head.cast("Q") as words:
        for _ in range(attempts):
            before = words[OFF_SEQ // 8]
            if not before & 1:
                # Only the slots in use: a short copy is less likely to overlap the next write.
                n_groups = min(_N_GROUPS.unpack_from(head, OFF_N_GROUPS)[0], MAX_GROUPS)
                data = bytes(head[:OFF_GROUPS + n_groups * GROUP_SLOT_SIZE])
                if words[OFF_SEQ // 8] == before:
                    return _parse(data)
            # The writer is mid-record; on a busy node it may be descheduled there: let it run.
            time.sleep(0)
    raise BeaconError(f"beacon kept changing during {attempts} read attempts")


def open_beacon(path: str) -> mmap.mmap:
    """Map a beacon read-only; the mapping stays valid after the writer exits."""
    try:
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise BeaconError(f"cannot map beacon {path}: {e}") from e
