"""Findings about how a job was set up, from the environment each rank's hook recorded at start
(coordinator process; pure functions of those records): ranks that run different software or
set their process group up differently (ENV_MISMATCH), ranks of one node that use one CUDA
device (SHARED_DEVICE). Both are mistakes made before the first step, which otherwise show only
by reading every rank's log: a job that hangs in its first collective, or runs at a fraction of
its speed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from watchdog.coordinator.sides import replica_culprits
from watchdog.explain.advice import ONE_GPU_PER_RANK_FIX, SAME_ENVIRONMENT_FIX
from watchdog.model import Environment, Kind
from watchdog.text import bounded, ranks_text

CAUSES = {
    Kind.ENV_MISMATCH: (
        "The ranks of one job run different software (torch, CUDA, NCCL, Python or this "
        "watchdog) or set their process group up differently (world size, backend): ranks "
        "built against different NCCL or torch versions may hang or fail in their first "
        "collective, and ranks that disagree on the world size or backend never form one group.",
        SAME_ENVIRONMENT_FIX[0].upper() + SAME_ENVIRONMENT_FIX[1:] + "."),
    Kind.SHARED_DEVICE: (
        "Several ranks of one node compute on, or run their process group on, the same GPU: "
        "the processes never called torch.cuda.set_device(local_rank), so each uses cuda:0 "
        "(`model.cuda()` with no index, NCCL's current device), or they were given device_ids "
        "that do not fit their LOCAL_RANK. They share one GPU's memory and time while the "
        "others idle, and NCCL refuses two ranks on one device.",
        ONE_GPU_PER_RANK_FIX[0].upper() + ONE_GPU_PER_RANK_FIX[1:] + "."),
}

SHOWN_VALUES = 3  # odd values a summary names of one field (a rank sends any text it likes)
SHOWN_CHARS = 64
# (label in a summary, Environment field) of what every rank of a job must agree on
COMPARED = (("torch", "torch"), ("CUDA", "cuda"), ("NCCL", "nccl"), ("Python", "python"),
            ("watchdog", "watchdog"), ("backend", "backend"), ("world size", "world_size"))


@dataclass(frozen=True)
class Noted:
    """A rank's environment, with where it runs."""

    host: str
    local_rank: int
    environment: Environment


@dataclass(frozen=True)
class Found:
    kind: Kind
    key: str
    culprit_ranks: tuple[int, ...]
    summary: str


def env_mismatch(noted: Mapping[int, Noted]) -> Found | None:
    """The ranks that differ from their peers in any compared field, with the values side by
    side ("rank 5 on node-b runs NCCL 2.21.5, ranks 0-4,6,7 run 2.27.3"); None when all agree.
    A value a rank could not know (a world size of 0, a backend never given) compares with none."""
    culprits: set[int] = set()
    said = []
    for label, name in COMPARED:
        values = {rank: getattr(n.environment, name) for rank, n in noted.items()}
        values = {rank: value for rank, value in values.items() if value not in ("", 0)
                  or name not in ("backend", "world_size")}
        odd = replica_culprits(values)
        if odd:
            culprits.update(odd)
            said.append(_side_by_side(label, values, odd, noted))
    if not culprits:
        return None
    return Found(Kind.ENV_MISMATCH, Kind.ENV_MISMATCH.check, tuple(sorted(culprits)),
                 "; ".join(said))


def _side_by_side(label: str, values: Mapping[int, object], odd: tuple[int, ...],
                  noted: Mapping[int, Noted]) -> str:
    """Each odd value with its ranks and hosts, then the others' value."""
    by_value: dict[object, list[int]] = {}
    for rank in odd:
        by_value.setdefault(values[rank], []).append(rank)
    parts = [f"{_ranks_on(ranks, noted)} {_run(ranks)} {label} {_shown(value)}"
             for value, ranks in list(by_value.items())[:SHOWN_VALUES]]
    if len(by_value) > SHOWN_VALUES:
        parts.append(f"{len(by_value) - SHOWN_VALUES} more values")
    others = sorted(r for r in values if r not in odd)
    if others:
        parts.append(f"{ranks_text(others)} {_run(others)} {_shown(values[others[0]])}")
    return ", ".join(parts)


def _ranks_on(ranks: list[int], noted: Mapping[int, Noted]) -> str:
    hosts = sorted({noted[r].host for r in ranks})
    return f"{ranks_text(ranks)} on {', '.join(hosts[:3])}{' ...' if len(hosts) > 3 else ''}"


def _run(ranks: list[int]) -> str:
    return "runs" if len(ranks) == 1 else "run"


def _shown(value: object) -> str:
    return bounded(str(value), SHOWN_CHARS) if value not in ("", None) else "none"


def physical_device(index: int, visible: str) -> str:
    """The GPU a CUDA device index names under CUDA_VISIBLE_DEVICES (an index or a UUID from
    the list), as nvidia-smi names it; the index itself where the variable is not set."""
    entries = [entry.strip() for entry in visible.split(",")] if visible else []
    if not entries:
        return str(index)
    return entries[index] if 0 <= index < len(entries) else f"{index} (not visible)"


def expected_index(local_rank: int, visible: str) -> int:
    """The device index LOCAL_RANK should use where CUDA_VISIBLE_DEVICES leaves every GPU of
    the node visible (unset, or listing more than LOCAL_RANK of them); -1 where it says nothing
    (one GPU per process is cuda:0)."""
    listed = len(visible.split(",")) if visible else None
    if local_rank < 0 or (listed is not None and listed <= max(local_rank, 1)):
        return -1
    return local_rank


def shared_devices(noted: Mapping[int, Noted]) -> list[Found]:
    """Per node and GPU, the ranks that use it, where two or more do; and a rank whose DDP
    module is on another device than its LOCAL_RANK's, where CUDA_VISIBLE_DEVICES would make
    them equal. None on CPU jobs."""
    users: dict[tuple[str, str], set[int]] = {}
    astray: list[tuple[int, Noted]] = []
    for rank, n in noted.items():
        env = n.environment
        for index in {env.group_device, env.module_device} - {-1}:
            device = physical_device(index, env.visible_devices)
            users.setdefault((n.host, device), set()).add(rank)
        expected = expected_index(n.local_rank, env.visible_devices)
        if env.module_device >= 0 and expected >= 0 and env.module_device != expected:
            astray.append((rank, n))
    found = [_shared(host, device, ranks) for (host, device), ranks in sorted(users.items())
             if len(ranks) > 1]
    return found + [_astray(rank, n) for rank, n in astray
                    if not any(rank in f.culprit_ranks for f in found)]


def _shared(host: str, device: str, ranks: set[int]) -> Found:
    culprits = tuple(sorted(ranks))
    return Found(Kind.SHARED_DEVICE, f"{Kind.SHARED_DEVICE.check}:{host}:{device}", culprits,
                 f"{ranks_text(culprits)} on {host} all use GPU {device}: their tensors or "
                 "process group share one device")


def _astray(rank: int, n: Noted) -> Found:
    env = n.environment
    return Found(Kind.SHARED_DEVICE, f"{Kind.SHARED_DEVICE.check}:{n.host}:rank{rank}", (rank,),
                 f"rank {rank} on {n.host} (LOCAL_RANK {n.local_rank}) has its DDP module on "
                 f"cuda:{env.module_device}, not cuda:{n.local_rank}: it shares a GPU with "
                 "another rank of the node, or leaves its own idle")
