"""The in-process hook: the recorder and its beacon, driven directly in this process."""

from __future__ import annotations

import copy
import itertools
import json
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import watchdog
from watchdog.beacon import (
    EXIT_CLEAN,
    MAX_EXIT_REASON,
    MAX_GROUPS,
    BeaconSnapshot,
    BeaconWriter,
    Identity,
    open_beacon,
    read_beacon,
)
from watchdog.hook import lifecycle
from watchdog.hook.exit_reason import INNERMOST, describe
from watchdog.hook.patches.group_setup import rank_and_world, rendezvous
from watchdog.hook.patches.install import TorchPatches
from watchdog.hook.recorder import Recorder

DDP_GROUP = object()  # a DDP module's process group, as its forward passes it
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "WATCHDOG_HOOK_PID", "WATCHDOG_AUTOINSTALL")


def test_install_outside_torchrun_arms_and_records_nothing(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for name in RANK_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WATCHDOG_BEACON_DIR", str(tmp_path))
    # arming leaves its recorder and its post-import finder behind: this process is no rank
    monkeypatch.setattr(lifecycle, "_recorder", None)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    assert watchdog.install() is False
    assert lifecycle._recorder is not None and lifecycle._recorder.writer is None
    monkeypatch.setattr(lifecycle, "_recorder", None)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("WATCHDOG_HOOK_PID", str(os.getppid()))  # a rank started this process
    assert watchdog.install() is False
    assert os.listdir(tmp_path) == []
    with watchdog.phase("anything"):
        watchdog.step()  # without a hook: no-ops


def make_recorder(tmp_path: Path) -> Recorder:
    identity = Identity("j", 0, 0, 2, "h", os.getpid(), 0.0)
    return Recorder(BeaconWriter(str(tmp_path / "r.beacon"), identity), identity)


def published(recorder: Recorder) -> BeaconSnapshot:
    """What the agent reads after the publisher thread's next round."""
    recorder.publish()
    return read_beacon(open_beacon(recorder.writer.path))


def test_events_reach_the_beacon_when_published(tmp_path: Path) -> None:
    recorder = make_recorder(tmp_path)
    slot = recorder.writer.group_slot("0", (0, 1), 2)
    recorder.complete(slot, recorder.enter(slot, b"all_reduce"))
    recorder.optimizer_stepped(None, None, None)
    unpublished = read_beacon(open_beacon(recorder.writer.path))
    assert (unpublished.steps, unpublished.groups[0].entered_seq) == (0, 0)
    snap = published(recorder)
    assert (snap.steps, snap.groups[0].entered_seq, snap.groups[0].completed_seq) == (1, 1, 1)
    assert snap.groups[0].entered_at <= snap.step_at <= snap.heartbeat


def test_pending_collectives_complete_at_the_next_event(tmp_path: Path) -> None:
    recorder = make_recorder(tmp_path)
    slot = recorder.writer.group_slot("0", (0, 1), 2)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    assert published(recorder).groups[0].completed_seq == 0
    recorder.optimizer_stepped(None, None, None)
    snap = published(recorder)
    assert (snap.groups[0].completed_seq, snap.steps) == (1, 1)


def test_a_pending_collective_is_timed_when_first_published(tmp_path: Path) -> None:
    recorder = make_recorder(tmp_path)
    slot = recorder.writer.group_slot("0", (0, 1), 2)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    first = published(recorder)
    assert 0 < first.groups[0].entered_at <= first.heartbeat
    assert published(recorder).groups[0].entered_at == first.groups[0].entered_at
    time.sleep(0.01)  # so the clock has moved when the next one is stamped
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    assert published(recorder).groups[0].entered_at > first.groups[0].entered_at


def test_a_wait_completes_its_collective_unless_a_later_one_completed(tmp_path: Path) -> None:
    recorder = make_recorder(tmp_path)
    pair = recorder.writer.group_slot("0:p2p:0-1", (0, 1), 2)
    first = recorder.enter(pair, b"isend")
    recorder.leave_pending(pair, first)
    recorder.waited(((pair, first),))
    assert published(recorder).groups[0].completed_seq == 1
    second = recorder.enter(pair, b"irecv")
    recorder.leave_pending(pair, second)
    recorder.complete(pair, recorder.enter(pair, b"send"))  # its event completes the irecv
    recorder.waited(((pair, second),))  # waited for late: the slot keeps #3
    group = published(recorder).groups[0]
    assert (group.entered_seq, group.completed_seq, group.op) == (3, 3, "send")


def test_a_second_pending_collective_completes_the_first(tmp_path: Path) -> None:
    """Two DDP forwards without an optimizer step between them (an evaluation pass with grad)."""
    recorder = make_recorder(tmp_path)
    slot = recorder.writer.group_slot("0", (0, 1), 2)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    group = published(recorder).groups[0]
    assert (group.entered_seq, group.completed_seq) == (2, 1)
    recorder.step()
    assert published(recorder).groups[0].completed_seq == 2
    # not counted once steps are manual, but still an event
    recorder.optimizer_stepped(None, None, None)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    recorder.optimizer_stepped(None, None, None)
    snap = published(recorder)
    assert (snap.groups[0].entered_seq, snap.groups[0].completed_seq, snap.steps) == (3, 3, 1)


def test_collectives_called_on_ddps_group_take_their_turn_among_its_counted_all_reduces(
        tmp_path: Path) -> None:
    """DDP's all-reduces are counted: an explicit collective on its group between them gets the
    next seq, completes them, and the all-reduces after it count on from it."""
    recorder = make_recorder(tmp_path)
    slot = recorder.writer.group_slot("0", (0, 1), 2)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    seq = recorder.enter(slot, b"broadcast")
    group = published(recorder).groups[0]
    assert (seq, group.entered_seq, group.completed_seq, group.op) == (3, 3, 2, "broadcast")
    recorder.complete(slot, seq)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    group = published(recorder).groups[0]
    assert (group.entered_seq, group.completed_seq, group.op) == (4, 3, "all_reduce")
    other = recorder.writer.group_slot("1", (0,), 1)
    recorder.complete(other, recorder.enter(other, b"barrier"))  # an event: completes #4
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    recorder.optimizer_stepped(None)
    group = published(recorder).groups[0]
    assert (group.entered_seq, group.completed_seq, group.op) == (5, 5, "all_reduce")


def test_a_publish_beside_a_training_thread_never_goes_back_nor_ahead(tmp_path: Path) -> None:
    """The publisher thread copies while the training thread counts DDP's all-reduces and
    enters collectives on its group: every publish is at most what was recorded, never behind
    the publish before it, and never completes what was not entered."""
    recorder = make_recorder(tmp_path)
    slot = recorder.writer.group_slot("0", (0, 1), 2)
    recorder.ddp_all_reduce(DDP_GROUP, slot)
    seen: list[tuple[int, int, int]] = []  # (entered, completed, entered so far by then)
    done = threading.Event()
    recorded = [1]

    def publisher() -> None:
        while not done.is_set():
            entered, completed = recorder.progress()
            seen.append((entered[slot][0], completed.get(slot, 0), recorded[0]))

    thread = threading.Thread(target=publisher)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as the interpreter can
    thread.start()
    try:
        for step in range(20_000):  # each counted before it is recorded
            recorded[0] += 1
            recorder.ddp_all_reduce(DDP_GROUP, slot)
            if step % 3 == 0:
                recorded[0] += 1
                recorder.complete(slot, recorder.enter(slot, b"all_reduce"))
            recorder.optimizer_stepped(None)
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(old_interval)
    assert len(seen) > 100
    for (entered, completed, _), (later, _, recorded_by) in itertools.pairwise(seen):
        assert completed <= entered <= later <= recorded_by
    entered, completed = recorder.progress()
    assert entered[slot][0] == completed[slot] == recorded[0]


def test_each_collective_shows_its_own_op(tmp_path: Path) -> None:
    recorder = make_recorder(tmp_path)
    slot = recorder.writer.group_slot("0", (0, 1), 2)
    seen = []
    for op in (b"all_reduce", b"barrier", b"barrier", b"all_gather_into_tensor", b"all_reduce"):
        recorder.complete(slot, recorder.enter(slot, op))
        seen.append(published(recorder).groups[0].op)
    assert seen == ["all_reduce", "barrier", "barrier", "all_gather_into_tensor", "all_reduce"]


def test_manual_steps_take_over_from_optimizer_steps(tmp_path: Path) -> None:
    recorder = make_recorder(tmp_path)
    recorder.optimizer_stepped(None, None, None)
    recorder.step()
    # a second optimizer, or the same loop's: not counted again
    recorder.optimizer_stepped(None, None, None)
    recorder.step()
    assert published(recorder).steps == 3


def test_internal_fault_disables_recording_and_removes_the_beacon(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recorder = make_recorder(tmp_path)
    assert recorder.enter(MAX_GROUPS, b"all_reduce") == 0  # no such slot
    recorder.step()
    assert not recorder.enabled
    assert not os.path.exists(recorder.writer.path)
    assert capsys.readouterr().err.count("hook disabled after an internal error") == 1


def raised_in(call: Any, *args: Any) -> BaseException:
    try:
        call(*args)
    except Exception as e:
        return e
    raise AssertionError("it did not raise")


class Exploding:
    def __deepcopy__(self, memo: object) -> object:
        raise RuntimeError("shard 7 is corrupt")


def test_an_exception_record_keeps_where_it_was_raised_and_the_users_frames() -> None:
    nested: list[Any] = [Exploding()]
    for _ in range(40):
        nested = [nested]
    record = describe(raised_in(lambda: copy.deepcopy(nested)))
    assert (record.type, record.message) == ("RuntimeError", "shard 7 is corrupt")
    functions = [function for function, _, _ in record.frames]
    assert functions[0] == "Exploding.__deepcopy__"  # innermost first
    assert functions[1:INNERMOST] == ["deepcopy", "_deepcopy_list", "deepcopy",
                                      "_deepcopy_list"]
    # beyond 80 frames of copy.py: the user's frames that called it
    assert functions[INNERMOST:] == [
        "test_an_exception_record_keeps_where_it_was_raised_and_the_users_frames.<locals>."
        "<lambda>"[:80], "raised_in"]
    assert record.frames[0][1] == __file__ and record.frames[0][2] > 0
    assert len(record.encode()) <= MAX_EXIT_REASON


def test_an_exception_record_stays_within_its_bound() -> None:
    record = describe(raised_in(json.loads, "[" + "x" * 100_000))
    assert record.type == "JSONDecodeError"
    assert record.message.startswith("Expecting value: line 1 column 2")
    assert len(record.encode()) <= MAX_EXIT_REASON
    def fail() -> None:
        raise RuntimeError("é" * 50_000)

    huge = describe(raised_in(fail))
    assert huge.message == "é" * 200 and len(huge.encode()) <= MAX_EXIT_REASON
    assert [function for function, _, _ in huge.frames] == [
        "test_an_exception_record_stays_within_its_bound.<locals>.fail", "raised_in"]


def test_an_exception_whose_message_cannot_be_formatted_still_gives_a_record() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no")

    record = describe(Unprintable())
    assert record.type.endswith("Unprintable") and "could not be formatted" in record.message


@pytest.mark.parametrize(("arguments", "env", "expected"), [
    ({"rank": 2, "world_size": 4}, {}, (2, 4)),
    ({"init_method": "tcp://10.0.0.1:23456?rank=1&world_size=8"}, {}, (1, 8)),
    ({"init_method": "file:///tmp/rdzv?rank=0&world_size=2", "rank": 1}, {}, (1, 2)),
    ({"init_method": "env://"}, {"RANK": "3", "WORLD_SIZE": "4"}, (3, 4)),
    ({"rank": -1}, {"RANK": "x"}, (-1, -1)),
    ({"rank": 1}, {}, (-1, -1)),  # no world size anywhere: known once the group is up
])
def test_the_rank_init_process_group_is_given(arguments: dict[str, Any], env: dict[str, str],
                                              expected: tuple[int, int]) -> None:
    assert rank_and_world(arguments, env) == expected


def test_where_the_ranks_meet() -> None:
    master = {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500"}
    assert rendezvous({}, master) == "env://10.0.0.9:29500"
    assert rendezvous({"init_method": "env://"}, {}) == "env://?:?"
    assert rendezvous({"init_method": "tcp://h:1?rank=0&world_size=2"}, master) == "tcp://h:1"
    assert rendezvous({"store": object()}, master) == "a store the program created"


def test_an_exit_is_timed_when_sys_exit_is_called_not_at_atexit(tmp_path: Path) -> None:
    """torch's own exit handlers run before the hook's atexit and drop the peers'
    connections: an exit stamped there looked later than the crashes it caused."""
    recorder = make_recorder(tmp_path)
    recorder.note_exit(3)
    called = time.time()
    time.sleep(0.05)  # the interpreter shutting down
    recorder.mark_shutdown()
    snap = read_beacon(open_beacon(recorder.writer.path))
    assert (snap.exit_state, snap.exit_code) == (EXIT_CLEAN, 3)
    assert 0 < snap.exited_at <= called


# torch.nn.parallel.distributed as the hook sees it: DDP's constructor calls the two helpers
# through its module's namespace, the group as torch 2.13 passes it (by position, by keyword).
DDP_MODULE = """
def _verify_param_shape_across_processes(process_group, tensors, logger=None):
    during.append(seen())

def _sync_module_states(module, process_group, broadcast_bucket_size, src,
                        params_and_buffers_to_ignore, broadcast_buffers=True):
    during.append(seen())

class DistributedDataParallel:
    def __init__(self, process_group):
        self.process_group = process_group
        _verify_param_shape_across_processes(self.process_group, [])
        _sync_module_states(module=self, process_group=self.process_group,
                            broadcast_bucket_size=1, src=0, params_and_buffers_to_ignore=())

    def forward(self):
        pass

    def _sync_final_model(self):
        _sync_module_states(self, self.process_group, 1, 0, ())
"""


def ddp_module(source: str, seen: Callable[[], object]) -> tuple[types.ModuleType, list[object]]:
    """A module running `source`; its helpers append `seen()` to the list as they run."""
    module, during = types.ModuleType("ddp"), []
    module.__dict__.update(during=during, seen=seen)
    exec(source, module.__dict__)
    return module, during


def test_ddps_constructor_collectives_count_on_its_group(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # patch_ddp hands torch to the checks
    recorder = make_recorder(tmp_path)
    patches, group = TorchPatches(recorder), object()
    patches.slots.cache[group] = recorder.writer.group_slot("0", (0, 1), 2)  # as DDP's group is

    def seen() -> tuple[str, int, int]:
        world = published(recorder).groups[0]
        return world.op, world.entered_seq, world.completed_seq

    module, during = ddp_module(DDP_MODULE, seen)
    patches.patch_ddp(module)
    ddp = module.DistributedDataParallel(group)
    assert during == [("ddp_init", 1, 0), ("ddp_init", 2, 1)]  # entered while each runs
    assert seen() == ("ddp_init", 2, 2)
    ddp._sync_final_model()  # a Join's final sync: no constructor, not recorded
    assert during[-1] == seen() == ("ddp_init", 2, 2)


def test_a_torch_without_ddps_helpers_keeps_its_constructor_as_it_is(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    source = DDP_MODULE.replace("_verify_param_shape_across_processes", "_check_shapes").replace(
        "module, process_group, broadcast", "module, pg, broadcast")
    module, _ = ddp_module(source, lambda: None)
    helpers = (module._check_shapes, module._sync_module_states)
    TorchPatches(make_recorder(tmp_path)).patch_ddp(module)
    assert (module._check_shapes, module._sync_module_states) == helpers


def test_each_optimizer_step_counts_once_and_torchs_step_code_still_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted in the function torch calls after every step for its profiler, which still
    runs (a stand-in records the calls here)."""
    import torch

    ran: list[object] = []
    monkeypatch.setattr(torch.optim.Optimizer, "_optimizer_step_code",
                        lambda optimizer: ran.append(optimizer))
    recorder = make_recorder(tmp_path)
    TorchPatches(recorder).patch_optimizer(sys.modules["torch.optim.optimizer"])
    net = torch.nn.Linear(2, 1)
    sgd, adam = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.Adam(net.parameters())
    for _ in range(3):
        net(torch.ones(1, 2)).sum().backward()
        sgd.step()
    adam.step()
    assert ran == [sgd, sgd, sgd, adam]
    assert recorder.steps == published(recorder).steps == 4


def test_a_torch_without_the_step_code_function_counts_steps_by_a_global_step_hook(
        tmp_path: Path) -> None:
    import torch  # noqa: F401 (patch_optimizer hands torch to the checks)

    module, hooks = types.ModuleType("optimizer"), []
    module.Optimizer = type("Optimizer", (), {})  # type: ignore[attr-defined]
    module.register_optimizer_step_post_hook = hooks.append  # type: ignore[attr-defined]
    recorder = make_recorder(tmp_path)
    TorchPatches(recorder).patch_optimizer(module)
    (hook,) = hooks
    hook(module.Optimizer(), (), {})
    assert recorder.steps == 1
