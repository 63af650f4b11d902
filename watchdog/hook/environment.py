"""What a rank runs, recorded into its beacon once (runs inside every training rank; torch is
found in `sys.modules`, never imported): its versions and how it sets its process group up when
it calls init_process_group, before it waits for its peers (a job whose ranks disagree may
never get past that call), and the CUDA device of the first DDP module on CUDA when DDP wraps
it. The coordinator compares ranks (ENV_MISMATCH, SHARED_DEVICE).

Everything is read from what torch already knows: a device only once CUDA is initialised (the
program did that), NCCL's version from the library torch links. So it costs a few attribute
reads per process, and nothing on a step's path.

`WATCHDOG_TEST_ENVIRONMENT` ("RANK:FIELD=VALUE;...", e.g. "1:nccl=2.21.5") overrides what one rank
records. It is for the project's tests only, which have one torch and no NCCL to differ by.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

from watchdog.beacon import NO_ENVIRONMENT, Environment
from watchdog.env import TEST_ENVIRONMENT
from watchdog.hook.recorder import Recorder

_NUMBERS = frozenset({"world_size", "group_device", "module_device"})


def versions(torch: Any) -> Environment:
    """The versions of this process: torch's, the CUDA and NCCL it was built with, Python's and
    this package's."""
    import watchdog  # here: the hook package is imported by `watchdog` itself

    return Environment(torch=str(torch.__version__), cuda=str(torch.version.cuda or ""),
                       nccl=_nccl(torch), python=".".join(map(str, sys.version_info[:3])),
                       watchdog=watchdog.__version__,
                       visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""))


def _nccl(torch: Any) -> str:
    """NCCL's version as torch.cuda.nccl.version() gives it (a query of the library, no CUDA
    initialisation); "" for a torch built without NCCL."""
    if not hasattr(torch._C, "_nccl_version"):
        return ""
    try:
        return ".".join(str(part) for part in torch.cuda.nccl.version())
    except Exception:  # a build whose NCCL cannot be asked: the rank has none to compare
        return ""


def _uses_cuda(backend: str) -> bool:
    """Whether a process group of `backend` runs its collectives on a CUDA device (the default
    picks NCCL for CUDA tensors)."""
    return "nccl" in backend or backend == "default"


def _device_index(device: Any) -> int:
    """A CUDA device's index (a torch.device or an int); -1 for anything else."""
    if isinstance(device, int):
        return device
    if getattr(device, "type", "") == "cuda" and device.index is not None:
        return int(device.index)
    return -1


def _current_device(torch: Any) -> int:
    """The current CUDA device where the program initialised CUDA; -1 otherwise (asking would
    initialise it)."""
    return int(torch.cuda.current_device()) if torch.cuda.is_initialized() else -1


def overridden(env: Environment, rank: int, spec: str) -> Environment:
    """`env` with what WATCHDOG_TEST_ENVIRONMENT says of `rank` (see the module's docstring)."""
    changes: dict[str, Any] = {}
    for item in spec.split(";"):
        who, _, setting = item.partition(":")
        field, _, value = setting.partition("=")
        if who.strip() != str(rank) or not hasattr(env, field):
            continue
        if field not in _NUMBERS:
            changes[field] = value
        elif value.lstrip("-").isdigit():
            changes[field] = int(value)
    return dataclasses.replace(env, **changes)


class EnvironmentRecord:
    """The environment of one rank, as its beacon holds it."""

    def __init__(self, rec: Recorder) -> None:
        self._rec = rec
        self._env = NO_ENVIRONMENT
        self._module_seen = False

    def at_init(self, arguments: Mapping[str, Any], world_size: int) -> None:
        """init_process_group was called with `arguments` (bound by name), for `world_size`."""
        torch = sys.modules.get("torch")
        if torch is None or not self._rec.enabled:
            return
        backend = str(arguments.get("backend") or "default").lower()
        device = _device_index(arguments.get("device_id"))
        if device < 0 and _uses_cuda(backend):
            device = _current_device(torch)
        self._write(dataclasses.replace(versions(torch), backend=backend, world_size=world_size,
                                        group_device=device))

    def at_ddp(self, ddp: Any) -> None:
        """DDP wrapped a module: the first on CUDA says the device the rank computes on, and
        the one its process group uses where init could not tell yet."""
        torch = sys.modules.get("torch")
        if (torch is None or self._module_seen or not self._rec.enabled
                or getattr(ddp, "device_type", "") != "cuda"):
            return
        self._module_seen = True
        env = self._env if self._env != NO_ENVIRONMENT else versions(torch)
        group = env.group_device
        if group < 0 and _uses_cuda(env.backend):
            group = _current_device(torch)
        self._write(dataclasses.replace(env, module_device=_device_index(ddp.device),
                                        group_device=group))

    def _write(self, env: Environment) -> None:
        rec = self._rec
        if rec.identity is not None and TEST_ENVIRONMENT in os.environ:
            env = overridden(env, rec.identity.rank, os.environ[TEST_ENVIRONMENT])
        self._env = env
        if rec.writer is not None:
            rec.run_check(rec.writer.set_environment, env)
