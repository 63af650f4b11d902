"""The beacon: what the writer puts in is what a reader gets out, whole, or a BeaconError."""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchdog.beacon import (
    EXIT_EXCEPTION,
    MAX_EXIT_REASON,
    MAX_GROUPS,
    MAX_LISTED_RANKS,
    NO_ENVIRONMENT,
    NOT_ENTERED,
    SIZE,
    UNTIMED,
    BeaconGroup,
    BeaconWriter,
    CheckState,
    Environment,
    Fingerprint,
    Identity,
    RaisedException,
    Setup,
    beacon_path,
    open_beacon,
    read_beacon,
)
from watchdog.beacon.layout import (
    ALL_WORLD,
    FINGERPRINT_OF,
    GROUP_SLOT_SIZE,
    MAGIC,
    MAX_FINGERPRINTS,
    OFF_CHECKS,
    OFF_FINGERPRINTS,
    OFF_GROUPS,
    OFF_N_GROUPS,
    VERSION,
)
from watchdog.errors import BeaconError

IDENTITY = Identity("job-7@node-a:29500", 3, 1, 4, "node-b", 4242, 1764680000.5, attempt=2)
RAISED = RaisedException("RuntimeError", "DataLoader worker (pid 4242) is killed by signal: "
                         "Killed.", (("_error_if_any_worker_fails", "/venv/site-packages/torch/"
                                      "utils/data/_utils/signal_handling.py", 73),
                                     ("main", "/home/you/train.py", 88)))


def make_writer(tmp_path: Path, identity: Identity = IDENTITY) -> BeaconWriter:
    return BeaconWriter(str(tmp_path / "b.beacon"), identity)


def test_round_trip(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    world = writer.group_slot("0", (0, 1, 2, 3), 4)
    sub = writer.group_slot("1", (3, 1), 4)
    assert writer.group_slot("0", (0, 1, 2, 3), 4) == world
    entered = [NOT_ENTERED] * MAX_GROUPS
    entered[world], entered[sub] = (2, b"barrier", 11.0), (1, b"broadcast", 12.0)
    writer.publish(6, entered, {world: 1}, 13.0)
    writer.set_phase("checkpoint", 14.0, 600.0)
    writer.heartbeat(15.0)
    writer.set_setup(Setup("new_group", 15.5, "tcp://10.0.0.1:23456"))
    writer.mark_exit(EXIT_EXCEPTION, 1, 16.0, RAISED)

    snap = read_beacon(open_beacon(writer.path))

    assert snap.identity == IDENTITY
    assert snap.setup == Setup("new_group", 15.5, "tcp://10.0.0.1:23456")
    assert snap.raised == RAISED
    assert (snap.steps, snap.step_at, snap.heartbeat) == (6, 13.0, 15.0)
    assert (snap.phase, snap.phase_started, snap.phase_timeout) == ("checkpoint", 14.0, 600.0)
    assert (snap.exit_state, snap.exit_code, snap.exited_at) == (EXIT_EXCEPTION, 1, 16.0)
    assert snap.groups == (
        BeaconGroup("0", range(4), "barrier", 2, 11.0, 1),  # the whole world
        BeaconGroup("1", (3, 1), "broadcast", 1, 12.0, 0),
    )
    assert snap.events == 6 + 2 + 1 + 1 + 2  # steps, seqs entered and completed, groups joined
    assert snap.last_event_at == 13.0


def test_an_exception_record_too_large_is_left_out_whole(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    writer.mark_exit(EXIT_EXCEPTION, 1, 16.0, RaisedException("E", "x" * MAX_EXIT_REASON))
    assert read_beacon(open_beacon(writer.path)).raised is None


@pytest.mark.parametrize("raw", [b"{", b"[]", b'{"type": 1, "message": "", "frames": []}',
                                 b'{"type": "E", "message": "m", "frames": [["f", "g"]]}',
                                 b"\xff\xfe", b"[" * 5000])
def test_an_exception_record_that_is_not_one_reads_as_none(raw: bytes) -> None:
    decoded = RaisedException.decode(raw)
    assert decoded is None or decoded.frames == ()


def test_publish_stamps_steps_only_when_they_change(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    world = writer.group_slot("0", (0, 1), 2)
    for seq, op, now in ((1, b"all_reduce", 10.0), (1, b"all_reduce", 11.0), (2, b"barrier", 12.0)):
        entered = [NOT_ENTERED] * MAX_GROUPS
        entered[world] = (seq, op, now - 0.5)
        writer.publish(1 if now < 12.0 else 3, entered, {world: seq}, now)
        snap = read_beacon(open_beacon(writer.path))
        assert (snap.groups[0].op, snap.groups[0].entered_seq) == (op.decode(), seq)
    assert (snap.steps, snap.step_at, snap.groups[0].entered_at) == (3, 12.0, 11.5)


def test_a_compile_under_way_round_trips_until_a_publish_clears_it(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    writer.publish(3, [], {}, 20.0, compiling_since=17.25)
    assert read_beacon(open_beacon(writer.path)).compiling_since == 17.25
    writer.publish(3, [], {}, 21.0)
    assert read_beacon(open_beacon(writer.path)).compiling_since == 0.0


def test_world_group_is_stored_compactly_at_any_size(tmp_path: Path) -> None:
    writer = make_writer(tmp_path, Identity("j", 0, 0, 1000, "h", 1, 0.0))
    writer.group_slot("0", tuple(range(1000)), 1000)
    writer.group_slot("1", tuple(range(300)), 1000)
    groups = read_beacon(open_beacon(writer.path)).groups
    assert groups[0].ranks == range(1000)
    assert groups[1].ranks == tuple(range(MAX_LISTED_RANKS))  # the rest does not fit


def test_slots_run_out_without_error(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    slots = [writer.group_slot(str(i), (0, 1), 4) for i in range(MAX_GROUPS + 2)]
    assert slots == [*range(MAX_GROUPS), -1, -1]
    assert len(read_beacon(open_beacon(writer.path)).groups) == MAX_GROUPS


def test_beacon_path_keeps_job_ids_file_safe() -> None:
    path = beacon_path("/d", "run/1@host:29500", 2, 99)
    assert path == "/d/run_1_host_29500.rank2.pid99.beacon"


def test_the_checks_state_round_trips_with_the_progress(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    prints = (Fingerprint("parameters", "0", 0, 8, 2**64 - 1),
              Fingerprint("batch", "group-with-a-long-name-cut-at-32-bytes", 1, 16, 7),
              Fingerprint("optimizer", "1", 0, 8, 5))
    checks = CheckState(("replica_desync", "sampler_epoch_reused"), 5, prints, 12, 2, 40, 1,
                        64, 1, "3", "dtype of weight: torch.float32 -> torch.float64", 0,
                        float("inf"))
    writer.publish(70, [], {}, 1.0, checks=checks)
    snap = read_beacon(open_beacon(writer.path))
    cut = Fingerprint("batch", "group-with-a-long-name-cut-at-32", 1, 16, 7)
    assert snap.checks == dataclasses.replace(checks, fingerprints=(prints[0], cut, prints[2]))
    assert snap.steps == 70


def test_the_environment_round_trips_cut_where_it_is_long(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    assert read_beacon(open_beacon(writer.path)).environment == NO_ENVIRONMENT
    uuids = ",".join(f"GPU-{n:08x}-aaaa-bbbb-cccc-dddddddddddd" for n in range(8))
    env = Environment(torch="2.13.0+cu126", cuda="12.6", nccl="2.27.3", python="3.11.2",
                      watchdog="0.1.0", backend="cpu:gloo,cuda:nccl", world_size=8,
                      group_device=0, module_device=3, visible_devices=uuids)
    writer.set_environment(env)
    writer.publish(1, [], {}, 1.0)  # progress leaves it as it is
    snap = read_beacon(open_beacon(writer.path))
    assert snap.environment == dataclasses.replace(env, visible_devices=uuids[:256])
    assert snap.steps == 1


def test_writer_survives_its_reader_mapping(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    mapping = open_beacon(writer.path)
    writer.publish(1, [], {}, 1.0)
    writer.close()
    assert read_beacon(mapping).steps == 1


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b"XXXXXXXX" + b[8:], "bad magic"),
        (lambda b: b[:8] + struct.pack("<I", VERSION + 1) + b[12:], f"version {VERSION + 1}"),
        (lambda b: b[:12] + struct.pack("<I", SIZE + 8) + b[16:], "size"),
        (lambda b: b[: SIZE - 1], "bytes, expected"),
        (lambda b: b[:16] + struct.pack("<Q", 7) + b[24:], "kept changing"),
        (lambda b: _with_n_groups(b, MAX_GROUPS + 1), "process groups"),
        (lambda b: _with_u32(b, OFF_CHECKS + 4, MAX_FINGERPRINTS + 1),
         f"{MAX_FINGERPRINTS + 1} fingerprints"),
        (lambda b: _with_u32(_with_u32(b, OFF_CHECKS + 4, 1), OFF_FINGERPRINTS,
                              len(FINGERPRINT_OF) + 1), f"unknown kind {len(FINGERPRINT_OF) + 1}"),
    ],
)
def test_damaged_beacons_raise_beacon_error(tmp_path: Path, damage: Callable[[bytes], bytes],
                                            message: str) -> None:
    writer = make_writer(tmp_path)
    writer.group_slot("0", (0, 1), 4)
    good = bytes(open_beacon(writer.path))
    with pytest.raises(BeaconError, match=message):
        read_beacon(damage(good), attempts=3)


def test_unreadable_beacon_file_raises_beacon_error(tmp_path: Path) -> None:
    (tmp_path / "empty.beacon").write_bytes(b"")
    with pytest.raises(BeaconError, match="cannot map"):
        open_beacon(str(tmp_path / "empty.beacon"))
    with pytest.raises(BeaconError, match="cannot map"):
        open_beacon(str(tmp_path / "missing.beacon"))


def _with_n_groups(data: bytes, n_groups: int) -> bytes:
    return _with_u32(data, OFF_N_GROUPS, n_groups)


def _with_u32(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack("<I", value) + data[offset + 4:]


def _write_forever(writer: BeaconWriter) -> None:
    """Each round leaves values a reader can cross-check: op and time name the seq they go with,
    steps trail the completed seq. A torn read mixes rounds and breaks one of these."""
    seq = 0
    while True:
        seq += 1
        entered = [(seq, f"op{seq}".encode(), float(seq))]
        writer.publish(seq - 1, entered, {0: seq - 1}, float(seq - 1))
        writer.publish(seq, entered, {0: seq}, float(seq))
        # A few microseconds between rounds, as between a rank's collectives: a writer that
        # never pauses starves any seqlock reader, which is not what this test is about.
        pause_until = time.perf_counter() + 5e-6
        while time.perf_counter() < pause_until:
            pass


def test_concurrent_reader_never_sees_a_torn_record(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    writer.group_slot("0", (0, 1, 2, 3), 4)
    process = multiprocessing.get_context("fork").Process(
        target=_write_forever, args=(writer,), daemon=True)
    process.start()
    reads, unsettled, seen = 0, 0, set()
    try:
        mapping = open_beacon(writer.path)
        # on a loaded machine, reader and writer may take turns: read until the writer moved
        while (len(seen) < 200 or reads < 5000) and reads < 1_000_000:
            reads += 1
            try:
                snap = read_beacon(mapping)
            except BeaconError:  # the writer was descheduled mid-write for all 1000 attempts
                unsettled += 1
                continue
            (group,) = snap.groups
            entered = group.entered_seq
            assert group.op == (f"op{entered}" if entered else "")
            assert group.entered_at == float(entered)
            assert group.completed_seq in (entered - 1, entered)
            assert snap.steps in (entered - 1, entered) and snap.steps <= group.completed_seq
            assert snap.step_at == float(snap.steps)
            seen.add(entered)
    finally:
        process.kill()
        process.join()
    assert unsettled <= reads // 100
    assert len(seen) >= 200, "the writer made too little progress for the test to mean anything"


@settings(max_examples=300, deadline=None)
@given(
    header=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    world=st.sampled_from([-1, 0, 1, 2**31 - 1]) | st.integers(-(2**31), 2**31 - 1),
    n_groups=st.integers(0, MAX_GROUPS + 2),
    n_listed=st.lists(st.sampled_from([ALL_WORLD, -2, 0, MAX_LISTED_RANKS + 1])
                      | st.integers(0, MAX_LISTED_RANKS), min_size=MAX_GROUPS,
                      max_size=MAX_GROUPS),
)
def test_any_bytes_give_a_snapshot_or_beacon_error(header: bool, seed: int, world: int,
                                                    n_groups: int, n_listed: list[int]) -> None:
    """Random bytes; with `header`, behind a valid header and with the fields that steer
    parsing chosen to reach every branch. Reading returns or raises BeaconError, nothing else."""
    data = bytearray(random.Random(seed).randbytes(SIZE))
    if header:
        struct.pack_into("<8sIIQ", data, 0, MAGIC, VERSION, SIZE, 0)
        struct.pack_into("<i", data, 44, world)  # identity.world_size
        struct.pack_into("<I", data, OFF_N_GROUPS, n_groups)
        for slot, listed in enumerate(n_listed):
            struct.pack_into("<i", data, OFF_GROUPS + slot * GROUP_SLOT_SIZE + 36, listed)
    try:
        snap = read_beacon(bytes(data), attempts=2)
    except BeaconError:
        return
    assert header
    assert len(snap.groups) == n_groups
    for group, listed in zip(snap.groups, n_listed[:n_groups], strict=True):
        assert len(group.ranks) == (world if listed == ALL_WORLD else listed)


def test_publish_times_an_untimed_entry_when_it_first_sees_its_seq(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    world = writer.group_slot("0", (0, 1), 2)
    entered = [NOT_ENTERED] * MAX_GROUPS
    stamps = []
    for seq, entered_at, now in ((1, UNTIMED, 10.0), (1, UNTIMED, 10.2), (2, 10.3, 10.4),
                                 (3, UNTIMED, 10.6), (3, UNTIMED, 10.8)):
        entered[world] = (seq, b"all_reduce", entered_at)
        writer.publish(0, entered, {}, now)
        group = read_beacon(open_beacon(writer.path)).groups[0]
        stamps.append((group.entered_seq, group.entered_at))
    assert stamps == [(1, 10.0), (1, 10.0), (2, 10.3), (3, 10.6), (3, 10.6)]
