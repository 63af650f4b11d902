"""The set-up findings: what a rank's hook records of its environment at init_process_group (a
real recorder on a real beacon), and the coordinator's ENV_MISMATCH and SHARED_DEVICE made of
the environments ranks recorded, both ways."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.builders import JOB, T0, rank
from tests.helpers.recorders import ddp_linear, one_rank, recorder  # noqa: F401 (a fixture)
from watchdog.beacon import NO_ENVIRONMENT, Environment, open_beacon, read_beacon
from watchdog.coordinator.environment import Noted, env_mismatch, shared_devices
from watchdog.coordinator.silent_bugs import SETTLE_S, FindingTracker
from watchdog.env import TEST_ENVIRONMENT
from watchdog.hook.environment import EnvironmentRecord
from watchdog.model import JobSnapshot, Kind

GOOD = Environment(torch="2.13.0+cu126", cuda="12.6", nccl="2.27.3", python="3.11.2",
                   watchdog="0.1.0", backend="nccl", world_size=8)


def on_gpus(*devices: tuple[str, int, int, int], visible: str = "") -> dict[int, Noted]:
    """Ranks 0.. as (host, local rank, process group's device, DDP module's device)."""
    return {r: Noted(host, local, dataclasses.replace(GOOD, group_device=group,
                                                      module_device=module,
                                                      visible_devices=visible))
            for r, (host, local, group, module) in enumerate(devices)}


# -- what the hook records --
def test_the_hook_records_its_versions_and_set_up_once_at_init(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    record = EnvironmentRecord(rec)
    assert read_beacon(open_beacon(rec.writer.path)).environment == NO_ENVIRONMENT
    record.at_init({"backend": "gloo", "init_method": "env://"}, 4)
    env = read_beacon(open_beacon(rec.writer.path)).environment
    assert (env.torch, env.cuda, env.backend, env.world_size) == (
        torch.__version__, torch.version.cuda or "", "gloo", 4)
    assert env.python == ".".join(map(str, sys.version_info[:3])) and env.watchdog
    # a CPU job's process group uses no CUDA device, and CUDA was not initialised to ask
    assert (env.group_device, env.module_device) == (-1, -1)
    assert not torch.cuda.is_initialized()


@pytest.mark.usefixtures("one_rank")
def test_a_ddp_module_on_the_cpu_records_no_device(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    record = EnvironmentRecord(rec)
    record.at_init({}, 1)
    record.at_ddp(ddp_linear())
    env = read_beacon(open_beacon(rec.writer.path)).environment
    assert (env.backend, env.module_device, env.group_device) == ("default", -1, -1)


def test_the_tests_override_changes_only_the_rank_it_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_ENVIRONMENT, "0:nccl=2.21.5;0:world_size=3;1:torch=1.0")
    rec = recorder(tmp_path)  # rank 0
    EnvironmentRecord(rec).at_init({"backend": "gloo"}, 4)
    env = read_beacon(open_beacon(rec.writer.path)).environment
    assert (env.nccl, env.world_size, env.torch) == ("2.21.5", 3, torch.__version__)


# -- ENV_MISMATCH --
def test_the_rank_that_runs_another_nccl_is_named_with_both_versions() -> None:
    noted = {r: Noted("node-b" if r >= 4 else "node-a", r % 4, GOOD) for r in range(8)}
    noted[5] = dataclasses.replace(noted[5], environment=dataclasses.replace(GOOD, nccl="2.21.5"))
    found = env_mismatch(noted)
    assert found is not None
    assert (found.kind, found.culprit_ranks) == (Kind.ENV_MISMATCH, (5,))
    assert found.summary == "rank 5 on node-b runs NCCL 2.21.5, ranks 0-4,6,7 run 2.27.3"


def test_several_differences_are_said_together_and_unknown_set_up_is_no_difference() -> None:
    noted = {r: Noted("node-a", r, GOOD) for r in range(4)}
    noted[2] = Noted("node-a", 2, dataclasses.replace(GOOD, torch="2.12.0", world_size=3))
    noted[3] = Noted("node-a", 3, dataclasses.replace(GOOD, backend="", world_size=0))
    found = env_mismatch(noted)
    assert found is not None and found.culprit_ranks == (2,)
    assert found.summary == ("rank 2 on node-a runs torch 2.12.0, ranks 0,1,3 run 2.13.0+cu126; "
                             "rank 2 on node-a runs world size 3, ranks 0,1 run 8")


def test_ranks_that_agree_are_no_finding() -> None:
    assert env_mismatch({r: Noted("node-a", r, GOOD) for r in range(4)}) is None


# -- SHARED_DEVICE --
def test_every_rank_on_gpu_0_is_named_with_the_device() -> None:
    # the seed's mistake: no set_device, model.cuda() and DDP(model) on every rank
    (found,) = shared_devices(on_gpus(*[("node-a", r, 0, 0) for r in range(4)]))
    assert (found.kind, found.culprit_ranks) == (Kind.SHARED_DEVICE, (0, 1, 2, 3))
    assert found.summary.startswith("ranks 0-3 on node-a all use GPU 0")


def test_a_process_group_on_gpu_0_is_shared_even_where_the_modules_are_not() -> None:
    # DDP(model.to(local_rank), device_ids=[local_rank]), but no set_device before NCCL's init
    (found,) = shared_devices(on_gpus(*[("node-a", r, 0, r) for r in range(2)]))
    assert found.culprit_ranks == (0, 1)


def test_correct_gpu_jobs_and_cpu_jobs_share_nothing() -> None:
    assert shared_devices(on_gpus(*[("node-a", r, r, r) for r in range(4)])) == []
    assert shared_devices(on_gpus(*[("node-a", r, -1, -1) for r in range(4)])) == []
    # two nodes, one GPU each: cuda:0 on each is two GPUs
    assert shared_devices(on_gpus(("node-a", 0, 0, 0), ("node-b", 0, 0, 0))) == []
    # one GPU per process by CUDA_VISIBLE_DEVICES: cuda:0 is the rank's own
    own = on_gpus(("node-a", 0, 0, 0), ("node-a", 1, 0, 0))
    own[1] = dataclasses.replace(own[1], environment=dataclasses.replace(
        own[1].environment, visible_devices="1"))
    own[0] = dataclasses.replace(own[0], environment=dataclasses.replace(
        own[0].environment, visible_devices="0"))
    assert shared_devices(own) == []


def test_one_visible_gpu_given_to_two_ranks_is_shared() -> None:
    (found,) = shared_devices(on_gpus(("node-a", 0, 0, 0), ("node-a", 1, 0, 0), visible="3"))
    assert found.summary.startswith("ranks 0,1 on node-a all use GPU 3")


def test_a_module_off_its_local_ranks_gpu_is_named_where_every_gpu_is_visible() -> None:
    found = shared_devices(on_gpus(("node-a", 0, 1, 1), ("node-a", 1, 0, 0)))
    assert [f.culprit_ranks for f in found] == [(0,), (1,)]
    assert "(LOCAL_RANK 1) has its DDP module on cuda:0, not cuda:1" in found[1].summary


# -- the job's findings --
def test_the_environments_are_compared_once_every_rank_sent_one_and_said_once() -> None:
    tracker = FindingTracker()
    envs = [GOOD, GOOD, dataclasses.replace(GOOD, nccl="2.21.5"), GOOD]
    states = [rank(r, environment=dataclasses.replace(e, world_size=4))
              for r, e in enumerate(envs)]
    snap = JobSnapshot(JOB, 4, T0, 0.0, False, tuple(states))
    for state in states[:2]:
        tracker.observe(state)
    assert tracker.pending and tracker.evaluate(snap, T0) == []  # ranks 2 and 3 to come
    for state in states[2:]:
        tracker.observe(state)
    (found,) = tracker.evaluate(snap, T0 + 0.5)
    assert (found.kind, found.culprit_ranks, found.step) == (Kind.ENV_MISMATCH, (2,), 0)
    assert "ENV_MISMATCH" not in found.fix and "same container image" in found.fix
    for state in states:  # the agent sends them again in its next reports
        tracker.observe(dataclasses.replace(state, environment=None))
        tracker.observe(state)
    assert not tracker.pending and tracker.evaluate(snap, T0 + SETTLE_S + 1) == []


def test_ranks_that_never_send_theirs_hold_the_comparison_back_only_so_long() -> None:
    tracker = FindingTracker()
    odd = rank(1, environment=dataclasses.replace(GOOD, python="3.10.12"))
    for state in (rank(0, environment=GOOD), odd, rank(2, environment=GOOD)):
        tracker.observe(state)
    snap = JobSnapshot(JOB, 4, T0, 0.0, False, ())
    assert tracker.evaluate(snap, T0) == []
    (found,) = tracker.evaluate(snap, T0 + SETTLE_S)
    assert found.summary == "rank 1 on node-a runs Python 3.10.12, ranks 0,2 run 3.11.2"
