"""Reading a beacon, in the agent (and in tests): one consistent copy under the writer's
seqlock (see `writer`), parsed into a `BeaconSnapshot`. The bytes come from the rank: a count
out of range is a BeaconError, never an index error, and nothing the beacon claims sizes what is
decoded (a whole-world group is a range, at any world size). `read_head` decodes only who wrote
it, for the agent to verify that writer before it decodes the rest.
"""

from __future__ import annotations

import math
import mmap
import time

from watchdog.beacon import layout
from watchdog.beacon.records import (
    BeaconGroup,
    BeaconHead,
    BeaconSnapshot,
    CheckState,
    Environment,
    Fingerprint,
    Identity,
    Pace,
    RaisedException,
    Setup,
)
from watchdog.errors import BeaconError


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _group(data: bytes, slot: int, world: int) -> BeaconGroup:
    base = layout.group_base(slot)
    name, _size, n_listed = layout.GROUP_META.unpack_from(data, base)
    op, entered_seq, entered_at, completed_seq = layout.GROUP_HOT.unpack_from(
        data, base + layout.GROUP_META.size)
    ranks: tuple[int, ...] | range
    if n_listed == layout.ALL_WORLD and 0 < world <= layout.MAX_WORLD:
        ranks = range(world)
    elif 0 <= n_listed <= min(layout.MAX_LISTED_RANKS, world):  # no more members than the world
        ranks = layout.RANKS.unpack_from(data, base + layout.OFF_RANKS)[:n_listed]
    else:
        raise BeaconError(f"beacon group slot {slot} lists {n_listed} ranks (world {world})")
    return BeaconGroup(name=_text(name), ranks=ranks, op=_text(op),
                       entered_seq=entered_seq, entered_at=entered_at,
                       completed_seq=completed_seq)


def _fingerprint(data: bytes, n: int) -> Fingerprint:
    """Fingerprint `n` of the checks region (copied from OFF_CHECKS on)."""
    of, module, step, digest, group = layout.FINGERPRINT.unpack_from(
        data, layout.CHECKS.size + n * layout.FINGERPRINT.size)
    if not 1 <= of <= len(layout.FINGERPRINT_OF):
        raise BeaconError(f"beacon fingerprint {n} is of unknown kind {of}")
    return Fingerprint(of=layout.FINGERPRINT_OF[of - 1], group=_text(group), module=module,
                       step=step, digest=digest)


def _checks(data: bytes) -> CheckState:
    """The checks region, copied from OFF_CHECKS on."""
    (mask, n_prints, taken, unsynced, reuses, reuse_step, epoch, change_step,
     change_module, change_group, change, nonfinite_after, nonfinite_value
     ) = layout.CHECKS.unpack_from(data, 0)
    if n_prints > layout.MAX_FINGERPRINTS:
        raise BeaconError(f"beacon claims {n_prints} fingerprints "
                          f"(at most {layout.MAX_FINGERPRINTS})")
    return CheckState(
        enabled=tuple(name for bit, name in enumerate(layout.CHECK_NAMES) if mask >> bit & 1),
        taken=taken, fingerprints=tuple(_fingerprint(data, n) for n in range(n_prints)),
        unsynced_steps=unsynced, sampler_reuses=reuses, sampler_reuse_step=reuse_step,
        sampler_epoch=epoch, ddp_change_step=change_step, ddp_change_module=change_module,
        ddp_change_group=_text(change_group), ddp_change=_text(change),
        nonfinite_step=nonfinite_after - 1, nonfinite_value=nonfinite_value)


def _environment(data: bytes) -> Environment:
    """The environment region, copied from OFF_ENVIRONMENT on."""
    (world, group_after, module_after, backend, torch, cuda, nccl, python, watchdog,
     visible) = layout.ENVIRONMENT.unpack_from(data, 0)
    return Environment(torch=_text(torch), cuda=_text(cuda), nccl=_text(nccl),
                       python=_text(python), watchdog=_text(watchdog), backend=_text(backend),
                       world_size=world, group_device=max(-1, group_after - 1),
                       module_device=max(-1, module_after - 1),
                       visible_devices=_text(visible))


def _pace(gap_p99: float, gaps: int) -> Pace:
    """The pace as a report may carry it: a p99 that is no duration reads as none measured."""
    return Pace(gap_p99=gap_p99 if math.isfinite(gap_p99) and gap_p99 >= 0 else 0.0, gaps=gaps)


def _raised(start: bytes, length: int) -> RaisedException | None:
    if not 0 < length <= layout.MAX_EXIT_REASON:
        return None
    return RaisedException.decode(start[layout.START.size:layout.START.size + length])


def _identity(data: bytes, attempt: int) -> Identity:
    pid, rank, local_rank, world, created, job, host = layout.IDENTITY.unpack_from(
        data, layout.OFF_IDENTITY)
    return Identity(job_id=_text(job), rank=rank, local_rank=local_rank, world_size=world,
                    host=_text(host), pid=pid, created_at=created, attempt=attempt)


def _parse(data: bytes, start: bytes, checks: bytes, env: bytes,
           waited: tuple[float, float]) -> BeaconSnapshot:
    """The snapshot of the regions a reader copied: the head and the used group slots, the
    start-up region (from OFF_START), the checks region (from OFF_CHECKS), the environment
    (from OFF_ENVIRONMENT), and the seconds waited in collectives (OFF_WAITED)."""
    (steps, step_at, n_groups, exit_state, exit_code, exited_at, phase, phase_started,
     phase_timeout) = layout.PROGRESS.unpack_from(data, layout.OFF_PROGRESS)
    if n_groups > layout.MAX_GROUPS:
        raise BeaconError(f"beacon claims {n_groups} process groups "
                          f"(at most {layout.MAX_GROUPS})")
    attempt, reason_len, call, setup_at, rendezvous = layout.START.unpack_from(start)
    progress_at, gap_p99, gaps = layout.PACE.unpack_from(data, layout.OFF_PACE)
    (compiling_since,) = layout.COMPILING.unpack_from(data, layout.OFF_COMPILING)
    identity = _identity(data, attempt)
    return BeaconSnapshot(
        identity=identity,
        heartbeat=layout.HEARTBEAT.unpack_from(data, layout.OFF_HEARTBEAT)[0],
        steps=steps, step_at=step_at, exit_state=exit_state, exit_code=exit_code,
        exited_at=exited_at, phase=_text(phase), phase_started=phase_started,
        phase_timeout=phase_timeout,
        groups=tuple(_group(data, slot, identity.world_size) for slot in range(n_groups)),
        progress_at=progress_at, pace=_pace(gap_p99, gaps), compiling_since=compiling_since,
        setup=Setup(call=_text(call), entered_at=setup_at, rendezvous=_text(rendezvous)),
        raised=_raised(start, reason_len), checks=_checks(checks),
        environment=_environment(env), waited=waited[0], waited_sq=waited[1])


def _check_header(buf: bytes | mmap.mmap) -> None:
    """BeaconError unless `buf` holds a beacon of the layout this reader knows."""
    if len(buf) < layout.SIZE:
        raise BeaconError(f"beacon is {len(buf)} bytes, expected {layout.SIZE}")
    magic, version, recorded_size = layout.HEADER.unpack_from(buf, 0)
    if magic != layout.MAGIC:
        raise BeaconError("not a torch-hang-watchdog beacon (bad magic)")
    if version != layout.VERSION or recorded_size != layout.SIZE:
        raise BeaconError(f"beacon version {version} size {recorded_size}; this reader knows "
                          f"version {layout.VERSION} size {layout.SIZE}")


def read_head(data: bytes) -> BeaconHead:
    """Who wrote the beacon `data` is one consistent copy of, and when it last lived; BeaconError
    if it is no beacon. Only fixed fields are decoded: no count the beacon claims is used."""
    _check_header(data)
    return BeaconHead(
        identity=_identity(data, layout.ATTEMPT.unpack_from(data, layout.OFF_START)[0]),
        heartbeat=layout.HEARTBEAT.unpack_from(data, layout.OFF_HEARTBEAT)[0],
        exited_at=layout.EXIT.unpack_from(data, layout.OFF_EXIT)[2])


def read_beacon(buf: bytes | mmap.mmap, attempts: int = 10_000) -> BeaconSnapshot:
    """A consistent snapshot of a beacon, or BeaconError if it is not one or never settles."""
    _check_header(buf)
    seq = layout.OFF_SEQ // 8
    with memoryview(buf) as view, view[:layout.SIZE] as head, head.cast("Q") as words:
        for _ in range(attempts):
            before = words[seq]
            if not before & 1:
                # Only the slots in use: a short copy is less likely to overlap the next write.
                n_groups = min(layout.N_GROUPS.unpack_from(head, layout.OFF_N_GROUPS)[0],
                               layout.MAX_GROUPS)
                data = bytes(head[:layout.group_base(n_groups)])
                start = bytes(head[layout.OFF_START:layout.OFF_REASON + layout.MAX_EXIT_REASON])
                checks = bytes(head[layout.OFF_CHECKS:layout.OFF_ENVIRONMENT])
                env = bytes(head[layout.OFF_ENVIRONMENT:layout.OFF_WAITED])
                waited = layout.WAITED.unpack_from(head, layout.OFF_WAITED)
                if words[seq] == before:
                    return _parse(data, start, checks, env, waited)
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
