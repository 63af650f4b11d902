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
VERSION = 3  # 2: the publisher's progress stamp and gap statistics; 3: the start-up region
# and the silent-bug checks
MAX_GROUPS = 16
MAX_LISTED_RANKS = 256
ALL_WORLD = -1  # n_listed for a group that spans the whole world, at any size
MAX_WORLD = 1 << 20  # a larger world size in a beacon is corruption, not a job

EXIT_RUNNING, EXIT_CLEAN, EXIT_EXCEPTION = 0, 1, 2

# The silent-bug checks a hook can run (`WATCHDOG_CHECKS`); bit i of the beacon's mask is the
# i-th name. Each is the lower-case name of the finding it feeds.
CHECK_NAMES = ("replica_desync", "no_grad_sync", "duplicate_data", "sampler_epoch_reused",
               "ddp_module_changed")
FINGERPRINT_OF = ("parameters", "batch")  # what a fingerprint is of; stored as index + 1

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
_PACE = struct.Struct("<ddQ")  # progress_at, gap_p99, gaps
# attempt (torchrun restart count), exit reason length, the process-group set-up call the rank
# is inside (init_process_group, new_group) since when, and where it meets its peers
_START = struct.Struct("<II24sd128s")
_ATTEMPT = struct.Struct("<I")
_SETUP = struct.Struct("<24sd128s")
_REASON_LEN = struct.Struct("<I")
MAX_EXIT_REASON = 2048  # bytes of UTF-8 JSON: an uncaught exception's type, message and frames
# The silent-bug checks (hook/checks.py): which run, fingerprints taken, gradient collectives,
# the sampler and the DDP module events, then the fingerprint records.
# enabled, n_fingerprints, taken, unsynced_steps, sampler_reuses, sampler_reuse_step,
# sampler_epoch, ddp_change_step, ddp_change_module, ddp_change_group, ddp_change
_CHECKS = struct.Struct("<IIQQQQqQI32s64s4x")
_FINGERPRINT = struct.Struct("<IIQQ32s")  # of, module, step, digest, group

OFF_SEQ = 16
OFF_HEARTBEAT = 24
OFF_IDENTITY = 32
OFF_PROGRESS = OFF_IDENTITY + _IDENTITY.size
OFF_N_GROUPS = OFF_PROGRESS + 16
OFF_EXIT = OFF_N_GROUPS + 4
OFF_PHASE = OFF_EXIT + _EXIT.size
OFF_PACE = 272
OFF_GROUPS = 512
GROUP_SLOT_SIZE = _GROUP_META.size + _GROUP_HOT.size + _RANKS.size
# Inside a slot: the hot fields that enter() and complete() store one by one.
OFF_OP = _GROUP_META.size
OFF_ENTERED_SEQ = OFF_OP + 24
OFF_ENTERED_AT = OFF_OP + 32
OFF_COMPLETED = OFF_OP + 40
OFF_START = OFF_GROUPS + MAX_GROUPS * GROUP_SLOT_SIZE  # version 3 appended this region
OFF_SETUP = OFF_START + 8
OFF_REASON = OFF_START + _START.size
START_REGION = 4096  # reserved; the next region begins after it
# The checks follow the start-up region.
OFF_CHECKS = OFF_START + START_REGION
OFF_FINGERPRINTS = OFF_CHECKS + _CHECKS.size
MAX_FINGERPRINTS = 24  # 4 DDP modules x (parameters, batch) x the last 3 of each
SIZE = OFF_FINGERPRINTS + MAX_FINGERPRINTS * _FINGERPRINT.size

assert OFF_PROGRESS + _PROGRESS.size <= OFF_PACE and OFF_PACE + _PACE.size <= OFF_GROUPS
assert OFF_CHECKS % 8 == 0
assert OFF_PROGRESS % 8 == OFF_PACE % 8 == OFF_GROUPS % 8 == GROUP_SLOT_SIZE % 8 == 0
assert OFF_ENTERED_SEQ % 8 == 0 and OFF_START % 8 == 0
assert _START.size + MAX_EXIT_REASON <= START_REGION


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
    attempt: int = 0  # torchrun's restart count (TORCHELASTIC_RESTART_COUNT)


@dataclass(frozen=True)
class Setup:
    """The process-group set-up call a rank is inside, which waits for every member to arrive:
    `call` is init_process_group or new_group ("" when none), `rendezvous` where the members meet
    (an init method such as tcp://host:port, or env://MASTER_ADDR:MASTER_PORT)."""

    call: str = ""
    entered_at: float = 0.0
    rendezvous: str = ""


NO_SETUP = Setup()


@dataclass(frozen=True)
class RaisedException:
    """An uncaught exception, as the hook recorded it at exit; frames are (function, file, line),
    innermost first, possibly with gaps (see `hook.exit_reason`)."""

    type: str
    message: str
    frames: tuple[tuple[str, str, int], ...] = ()

    def encode(self) -> bytes:
        import json  # here: every Python process under `watchdog run` imports this module

        return json.dumps({"type": self.type, "message": self.message,
                           "frames": [list(f) for f in self.frames]},
                          ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> RaisedException | None:
        """The record, or None for anything that is not one: the bytes come from the rank."""
        import json

        try:
            data = json.loads(raw.decode())
            kind, message, frames = data["type"], data["message"], data["frames"]
            if not (isinstance(kind, str) and isinstance(message, str)
                    and isinstance(frames, list)):
                return None
            parsed = tuple((str(f[0]), str(f[1]), int(f[2])) for f in frames
                           if isinstance(f, list) and len(f) == 3 and isinstance(f[2], int))
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            return None
        return cls(kind, message, parsed)


@dataclass(frozen=True)
class Pace:
    """How the rank's progress went by the hook's own clock, as the publisher saw it."""

    progress_at: float = 0.0
    gap_p99: float = 0.0
    gaps: int = 0


@dataclass(frozen=True)
class Fingerprint:
    """A digest of one DDP module's parameters after optimizer step `step`, or of the batch its
    forward received after that step: equal on every replica that is in sync."""

    of: str  # one of FINGERPRINT_OF
    group: str  # the DDP module's process group
    module: int  # which DDP module of this process, in the order they were wrapped
    step: int
    digest: int


@dataclass(frozen=True)
class CheckState:
    """What the silent-bug checks of one rank found so far (hook/checks.py)."""

    enabled: tuple[str, ...] = ()  # of CHECK_NAMES
    taken: int = 0  # fingerprints taken so far: changes whenever one is added
    fingerprints: tuple[Fingerprint, ...] = ()
    unsynced_steps: int = 0  # optimizer steps since one was last seen
    sampler_reuses: int = 0  # shuffling DistributedSampler iterations that repeated an epoch
    sampler_reuse_step: int = 0  # the step of the first
    sampler_epoch: int = 0  # ...and its epoch
    ddp_change_step: int = 0  # when a DDP module's parameters were first seen changed; 0: never
    ddp_change_module: int = 0
    ddp_change_group: str = ""
    ddp_change: str = ""  # what changed: "dtype of weight: torch.float32 -> torch.float64"


NO_CHECKS = CheckState()


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
    progress_at: float = 0.0  # when the publisher last saw the event count change; 0: never
    gap_p99: float = 0.0  # p99 of the recent gaps between such changes, from the first step on
    gaps: int = 0  # how many gaps the hook measured
    setup: Setup = NO_SETUP
    raised: RaisedException | None = None  # what ended it, when an exception did
    checks: CheckState = NO_CHECKS

    @property
    def events(self) -> int:
        """Monotonic count of everything recorded: it changes exactly when the rank progressed.
        Joining a process group counts: start-up is progress too."""
        return self.steps + sum(g.entered_seq + g.completed_seq + 1 for g in self.groups)

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
            _ATTEMPT.pack_into(self._mm, OFF_START, max(0, identity.attempt))
            self._end()

    @property
    def n_groups(self) -> int:
        return len(self._ops)

    def set_setup(self, setup: Setup) -> None:
        with self._lock:
            self._begin()
            _SETUP.pack_into(self._mm, OFF_SETUP, setup.call.encode()[:24], setup.entered_at,
                             setup.rendezvous.encode()[:128])
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
                now: float, pace: Pace | None = None, checks: CheckState | None = None) -> None:
        """Record the rank's progress as one consistent record: the step count (stamped `now`
        when it changed) and, for each registered group, its last collective entered as
        (seq, op, time) and its last completed seq. An UNTIMED entry is stamped `now` by the
        first publish that sees its seq. `checks`, where given, replaces the checks' state."""
        words, doubles = self._words, self._doubles
        with self._lock:
            self._begin()
            if checks is not None:
                self._write_checks(checks)
            if pace is not None:
                doubles[OFF_PACE // 8] = pace.progress_at
                doubles[OFF_PACE // 8 + 1] = pace.gap_p99
                words[OFF_PACE // 8 + 2] = pace.gaps
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

    def _write_checks(self, checks: CheckState) -> None:
        prints = checks.fingerprints[-MAX_FINGERPRINTS:]
        mask = sum(1 << CHECK_NAMES.index(name) for name in checks.enabled)
        _CHECKS.pack_into(
            self._mm, OFF_CHECKS, mask, len(prints), checks.taken, checks.unsynced_steps,
            checks.sampler_reuses, checks.sampler_reuse_step, checks.sampler_epoch,
            checks.ddp_change_step, checks.ddp_change_module,
            checks.ddp_change_group.encode()[:32], checks.ddp_change.encode()[:64])
        for n, fp in enumerate(prints):
            _FINGERPRINT.pack_into(self._mm, OFF_FINGERPRINTS + n * _FINGERPRINT.size,
                                   FINGERPRINT_OF.index(fp.of) + 1, fp.module, fp.step,
                                   fp.digest, fp.group.encode()[:32])

    def set_phase(self, name: str, started: float, timeout: float) -> None:
        with self._lock:
            self._begin()
            _PHASE.pack_into(self._mm, OFF_PHASE, name.encode()[:32], started, timeout)
            self._end()

    def mark_exit(self, state: int, code: int, now: float,
                  raised: RaisedException | None = None) -> None:
        """How the process ends; an exception record that does not fit is left out whole."""
        reason = raised.encode() if raised is not None else b""
        if len(reason) > MAX_EXIT_REASON:
            reason = b""
        with self._lock:
            self._begin()
            _EXIT.pack_into(self._mm, OFF_EXIT, state, code, now)
            self._bytes[OFF_REASON:OFF_REASON + len(reason)] = reason
            _REASON_LEN.pack_into(self._mm, OFF_START + 4, len(reason))
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


def _parse_checks(data: bytes) -> CheckState:
    """The checks region, copied from OFF_CHECKS on."""
    (mask, n_prints, taken, unsynced, reuses, reuse_step, epoch, change_step,
     change_module, change_group, change) = _CHECKS.unpack_from(data, 0)
    if n_prints > MAX_FINGERPRINTS:
        raise BeaconError(f"beacon claims {n_prints} fingerprints (at most {MAX_FINGERPRINTS})")
    prints = []
    for n in range(n_prints):
        of, module, step, digest, group = _FINGERPRINT.unpack_from(
            data, _CHECKS.size + n * _FINGERPRINT.size)
        if not 1 <= of <= len(FINGERPRINT_OF):
            raise BeaconError(f"beacon fingerprint {n} is of unknown kind {of}")
        prints.append(Fingerprint(FINGERPRINT_OF[of - 1], _text(group), module, step, digest))
    enabled = tuple(name for bit, name in enumerate(CHECK_NAMES) if mask >> bit & 1)
    return CheckState(enabled, taken, tuple(prints), unsynced, reuses, reuse_step,
                      epoch, change_step, change_module, _text(change_group), _text(change))


def _parse(data: bytes, start: bytes, checks: bytes) -> BeaconSnapshot:
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
    attempt, reason_len, call, setup_at, rendezvous = _START.unpack_from(start)
    identity = Identity(_text(job), rank, local_rank, world, _text(host), pid, created, attempt)
    progress_at, gap_p99, gaps = _PACE.unpack_from(data, OFF_PACE)
    raised = None
    if 0 < reason_len <= MAX_EXIT_REASON:
        raised = RaisedException.decode(start[_START.size:_START.size + reason_len])
    return BeaconSnapshot(identity, _HEARTBEAT.unpack_from(data, OFF_HEARTBEAT)[0], steps,
                          step_at, exit_state, exit_code, exited_at, _text(phase), phase_started,
                          phase_timeout, tuple(groups), progress_at, gap_p99, gaps,
                          Setup(_text(call), setup_at, _text(rendezvous)), raised,
                          _parse_checks(checks))


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
                start = bytes(head[OFF_START:OFF_REASON + MAX_EXIT_REASON])
                checks = bytes(head[OFF_CHECKS:SIZE])
                if words[OFF_SEQ // 8] == before:
                    return _parse(data, start, checks)
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
