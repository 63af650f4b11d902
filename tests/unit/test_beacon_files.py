"""The beacon directory and beacon files, in this process: per-user subdirectories made and
checked through descriptors, beacons made without following links and reserved before use, and
the agent's side: only regular files of the right size and owner, read so that nothing a writer
does to the file can hurt the reader; and who counts as the beacon's writer."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import struct
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import beaconfiles, procfs, verify
from agent.budget import StackBudget
from agent.rankstate import rank_state
from agent.table import WorkerTable
from watchdog.beacon import (
    EXIT_CLEAN,
    MAX_GROUPS,
    MAX_WORLD,
    SIZE,
    BeaconWriter,
    Identity,
    beacon_path,
    read_beacon,
)
from watchdog.beacon.layout import OFF_GROUPS
from watchdog.beacondir import create_beacon_file, user_dir
from watchdog.errors import BeaconError

UID = os.geteuid()


def identity(pid: int = 0) -> Identity:
    return Identity("job", 0, 0, 2, "node-a", pid or os.getpid(), time.time())


def writer_in(base: Path) -> BeaconWriter:
    fd, directory = user_dir(str(base))
    return BeaconWriter(beacon_path(directory, "job", 0, os.getpid()), identity(), fd)


def test_the_hook_makes_a_sticky_base_and_a_0755_directory_of_its_own(tmp_path: Path) -> None:
    base = tmp_path / "beacons"
    old = os.umask(0o077)
    try:
        writer = writer_in(base)
    finally:
        os.umask(old)
    assert base.stat().st_mode & 0o7777 == 0o1777
    assert (base / str(UID)).stat().st_mode & 0o777 == 0o755
    assert Path(writer.path).parent == base / str(UID)
    assert Path(writer.path).stat().st_mode & 0o777 == 0o644
    assert [p.name for p in (base / str(UID)).iterdir()] == [Path(writer.path).name]


@pytest.mark.parametrize("squat", ["file", "link"])
def test_a_name_taken_by_anything_else_gets_a_directory_of_its_own(tmp_path: Path,
                                                                   squat: str) -> None:
    base = tmp_path / "beacons"
    base.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if squat == "file":
        (base / str(UID)).write_text("")
    else:
        (base / str(UID)).symlink_to(elsewhere)
    writer = writer_in(base)
    assert Path(writer.path).parent.name.startswith(f"{UID}-")
    assert list(elsewhere.iterdir()) == []


def test_a_base_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "beacons").symlink_to(tmp_path / "real")
    with pytest.raises(BeaconError, match="cannot use the beacon directory"):
        user_dir(str(tmp_path / "beacons"))


def test_a_beacon_is_never_made_through_a_link_and_replaces_a_stale_one(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    fd, directory = user_dir(str(tmp_path / "beacons"))
    path = beacon_path(directory, "job", 0, os.getpid())
    Path(path).write_text("stale")
    Path(directory, f".{Path(path).name}.new").symlink_to(victim)
    writer = BeaconWriter(path, identity(), fd)
    assert victim.read_text() == "precious"
    assert Path(path).stat().st_size == SIZE
    writer.remove()
    assert not Path(path).exists()


def test_an_unreservable_beacon_is_an_error_and_leaves_nothing(tmp_path: Path) -> None:
    fd, directory = user_dir(str(tmp_path / "beacons"))
    with pytest.raises(BeaconError, match="cannot reserve"):
        create_beacon_file(fd, "x.beacon", 1 << 62)
    assert os.listdir(directory) == []


def test_the_agent_finds_what_only_its_owner_could_put_there(tmp_path: Path) -> None:
    base = tmp_path / "beacons"
    writer = writer_in(base)
    planted = base / "planted"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    (planted / "x.beacon").write_bytes(b"\0" * SIZE)
    (base / "loose.beacon").write_bytes(b"\0" * SIZE)
    found = beaconfiles.scan(str(base))
    assert [f.path for f in found] == [writer.path]
    assert found[0].owner == UID


@pytest.mark.parametrize("kind", ["fifo", "link", "short", "long", "directory"])
def test_the_agent_opens_only_regular_files_of_a_beacons_size(tmp_path: Path, kind: str) -> None:
    _fd, directory = user_dir(str(tmp_path / "beacons"))
    path = Path(directory, "x.beacon")
    make = {"fifo": lambda: os.mkfifo(path), "link": lambda: path.symlink_to("/etc/hostname"),
            "short": lambda: path.write_bytes(b"\0" * (SIZE - 1)),
            "long": lambda: path.write_bytes(b"\0" * (SIZE + 1)), "directory": path.mkdir}
    make[kind]()
    (found,) = [beaconfiles.Found(directory, "x.beacon", UID, (0, 0, 0))]
    with pytest.raises(BeaconError):
        beaconfiles.open_beacon(found)


def test_truncation_and_growth_under_the_reader_are_errors_not_crashes(tmp_path: Path) -> None:
    writer = writer_in(tmp_path / "beacons")
    (found,) = beaconfiles.scan(str(tmp_path / "beacons"))
    fd, _ = beaconfiles.open_beacon(found)
    assert beaconfiles.read(fd).identity.job_id == "job"
    os.truncate(writer.path, 0)
    with pytest.raises(BeaconError, match="now 0 bytes"):
        beaconfiles.read(fd)
    os.truncate(writer.path, SIZE)
    with pytest.raises(BeaconError, match="bad magic"):
        beaconfiles.read(fd)  # the writer's record is gone: zeros
    os.close(fd)


@functools.cache
def good_beacon() -> bytes:
    """A real beacon's bytes, with a group in use."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        writer = writer_in(Path(d))
        writer.group_slot("0", (0, 1), 2)
        writer.publish(3, [(4, b"all_reduce", time.time())], {0: 3}, time.time())
        data = Path(writer.path).read_bytes()
        writer.close()
        return data


def damaged(spans: list[tuple[int, bytes]]) -> bytes:
    """A real beacon with random bytes written over some of it: its header still passes, so
    the reader goes on to everything behind it."""
    data = bytearray(good_beacon())
    for at, junk in spans:
        data[at:at + len(junk)] = junk
    return bytes(data[:SIZE])


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=512) | st.lists(
    st.tuples(st.integers(16, SIZE - 1), st.binary(min_size=1, max_size=64)),
    min_size=1, max_size=8).map(damaged))
def test_any_bytes_read_as_a_beacon_or_a_beacon_error(data: bytes) -> None:
    path = Path(f"/dev/shm/thw-unit-fuzz-{os.getpid()}")
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(BeaconError):
            beaconfiles.read(fd)
        with contextlib.suppress(BeaconError):
            read_beacon(data, attempts=1)
    finally:
        os.close(fd)
        path.unlink()


def test_the_writer_of_a_beacon_is_the_process_that_maps_it(tmp_path: Path) -> None:
    writer = writer_in(tmp_path / "beacons")
    boot = procfs.boot_time()
    st_ = os.stat(writer.path)
    created = identity().created_at
    assert verify.refuse_beacon_writer(os.getpid(), st_, created, boot) == ""
    other = tmp_path / "not-mapped"
    other.write_bytes(b"\0" * SIZE)
    assert "neither maps nor holds" in verify.refuse_beacon_writer(
        os.getpid(), os.stat(other), created, boot)
    assert "started after the beacon was made" in verify.refuse_beacon_writer(
        os.getpid(), st_, created - 3600 * 24 * 365, boot)
    foreign = os.stat_result((st_.st_mode, st_.st_ino, st_.st_dev, 1, UID + 1, 0, *st_[6:10]))
    assert "does not run as the beacon's owner" in verify.refuse_beacon_writer(
        os.getpid(), foreign, created, boot)
    assert verify.refuse_beacon_writer(2**22 + 7, st_, created, boot) == (
        f"process {2**22 + 7} is gone")


def test_a_verified_processs_environment_must_agree_with_its_beacon() -> None:
    assert verify.refuse_environment({"RANK": "3", "WORLD_SIZE": "8"}, 3, 8) == ""
    assert verify.refuse_environment({"RANK": "3"}, 3, 8) == ""
    assert verify.refuse_environment({"PATH": "/bin"}, 3, 8) == ""  # torch.multiprocessing.spawn
    assert "RANK is '5'" in verify.refuse_environment({"RANK": "5"}, 3, 8)
    assert "WORLD_SIZE is '1000000'" in verify.refuse_environment(
        {"RANK": "3", "WORLD_SIZE": "1000000"}, 3, 8)
    assert "cannot be read" in verify.refuse_environment(None, 3, 8)
    me = verify.credentials(os.getpid())
    assert me is not None and me.uid == UID


def test_stacks_of_a_job_are_taken_at_most_once_a_second() -> None:
    budget = StackBudget()
    assert budget.refuse("job", 100.0) == ""
    assert "at most once every 1s" in budget.refuse("job", 100.5)
    assert budget.refuse("other", 100.5) == ""
    assert budget.refuse("job", 101.0) == ""
    for n in range(5000):  # requests for ever new jobs do not grow it without bound
        budget.refuse(f"job-{n}", 200.0 + n)
    assert len(budget._jobs) <= 1024


def test_a_process_holding_beacons_of_many_jobs_is_dumped_at_most_once_a_second() -> None:
    """Each job's budget allows a dump a second: before the process's own, a process holding
    beacons of N jobs was paused N times a second."""
    budget = StackBudget()
    assert budget.refuse("job-a", 100.0) == "" and budget.refuse_process(4242, 100.0) == ""
    assert budget.refuse("job-b", 100.2) == ""
    assert "dumped 0.20s ago, for another job" in budget.refuse_process(4242, 100.2)
    assert budget.refuse_process(4343, 100.2) == ""  # another process of job-b
    assert budget.refuse_process(4242, 101.0) == ""
    for pid in range(5000):
        budget.refuse_process(pid, 200.0 + pid)
    assert len(budget._processes) <= 1024


def forged_in(base: Path, pid: int, world: int) -> BeaconWriter:
    """A beacon of this process's that names `pid`, in a world of `world` whose every group
    slot holds the whole world."""
    fd, directory = user_dir(str(base))
    writer = BeaconWriter(beacon_path(directory, "job", 0, pid),
                          Identity("job", 0, 0, world, "node-a", pid, time.time() - 1), fd)
    everyone = tuple(range(world))
    for n in range(MAX_GROUPS):
        writer.group_slot(str(n), everyone, world)
    return writer


def test_a_beacon_is_decoded_past_its_head_only_once_its_writer_is_verified(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Both beacons' group slots are damaged: the one naming another process is refused for
    that, before its groups are looked at; the one naming this process, for its groups."""
    base = tmp_path / "beacons"
    writers = [forged_in(base, pid, 4) for pid in (os.getppid(), os.getpid())]
    for writer in writers:
        with open(writer.path, "r+b") as f:
            os.pwrite(f.fileno(), struct.pack("<i", -7), OFF_GROUPS + 36)  # slot 0's n_listed
    with caplog.at_level(logging.WARNING, "agent.discover"):
        WorkerTable(str(base), scan_unhooked=False).refresh(time.time())
    other, own = (writer.path for writer in writers)
    assert (f"ignoring {other}: not a verified worker: process {os.getppid()} neither maps nor "
            "holds the beacon open") in caplog.text
    assert f"ignoring {own}: beacon group slot 0 lists -7 ranks (world 4)" in caplog.text


def test_a_writer_that_recorded_its_exit_and_let_its_beacon_go_is_refused_without_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A rank ending as the agent looks (its script failed at once: the hook's exit record is
    written, the beacon unmapped, the process not gone yet) is no forgery to warn of; the same
    beacon without the exit record is warned of (the test above)."""
    base = tmp_path / "beacons"
    ending = forged_in(base, os.getppid(), 4)
    ending.mark_exit(EXIT_CLEAN, 2, time.time())
    with caplog.at_level(logging.INFO, "agent.discover"):
        table = WorkerTable(str(base), scan_unhooked=False)
        table.refresh(time.time())
    assert table.workers() == []
    (record,) = [r for r in caplog.records if str(ending.path) in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (f"ignoring {ending.path}: process {os.getppid()} ended "
                                   "before it was verified")


def test_a_world_beyond_the_largest_job_is_refused(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Even from its verified writer: 131,072 ranks is the largest job there is."""
    writer = forged_in(tmp_path / "beacons", os.getpid(), 131_073)
    table = WorkerTable(str(tmp_path / "beacons"), scan_unhooked=False)
    with caplog.at_level(logging.WARNING, "agent.discover"):
        table.refresh(time.time())
    assert table.workers() == []
    assert (f"ignoring {writer.path}: not a verified worker: rank 0 of world size 131073"
            in caplog.text)


def test_whole_world_groups_are_never_listed_at_the_largest_world(tmp_path: Path) -> None:
    """A verified rank of the largest world, in as many whole-world groups as a beacon holds:
    reading its beacon and making its report entry allocate next to nothing (listing the
    groups' members would take some 75 MB), and the report lists no member."""
    forged_in(tmp_path / "beacons", os.getpid(), MAX_WORLD)
    table = WorkerTable(str(tmp_path / "beacons"), scan_unhooked=False)
    table.refresh(time.time())
    (worker,) = table.workers()
    tracemalloc.start()
    try:
        table.refresh(time.time())
        state = rank_state(worker, time.time())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert [g.ranks for g in state.groups] == [()] * MAX_GROUPS
