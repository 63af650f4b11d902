"""Which wrapper replaces which torch function, as each torch module finishes importing (runs
inside every training rank; the modules arrive as arguments, see `post_import`)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from watchdog.collectives import COLLECTIVES, POINT_TO_POINT
from watchdog.hook.patches import c10d as c10d_wrappers
from watchdog.hook.patches import ddp, setup
from watchdog.hook.patches.backward import wrap_backward
from watchdog.hook.patches.groups import GroupSlots
from watchdog.hook.patches.sampler import wrap_sampler_iter
from watchdog.hook.patches.works import PendingWorks, patch_work_wait
from watchdog.hook.recorder import Recorder


class TorchPatches:
    """The patches of one hooked process, and the state their wrappers share: the process group
    -> beacon slot cache and the async works not waited for yet. `become_rank` starts an armed
    recorder once init_process_group tells the rank. The checks' wrappers are installed whatever
    checks run: an armed process learns its checks only when it becomes a rank."""

    def __init__(self, recorder: Recorder, become_rank: setup.BecomeRank | None = None) -> None:
        self._rec = recorder
        self._become_rank = become_rank
        self._dist: Any = None
        self.slots = GroupSlots(recorder)
        self.works = PendingWorks(recorder)

    def post_import_hooks(self) -> dict[str, Callable[[ModuleType], None]]:
        return {
            "torch.distributed": self.patch_distributed,
            "torch.nn.parallel.distributed": self.patch_ddp,
            "torch.optim.optimizer": self.patch_optimizer,
            "torch._tensor": self.patch_tensor,
            "torch.utils.data.distributed": self.patch_sampler,
        }

    def patch_distributed(self, dist: ModuleType) -> None:
        c10d = getattr(dist, "distributed_c10d", None)
        if c10d is None:  # torch built without distributed support
            return
        self._dist = dist
        self.slots.attach(dist)
        rec, slots, works = self._rec, self.slots, self.works
        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            # A torch whose function takes no group is one this hook does not know: left alone.
            if original is not None and "group" in inspect.signature(original).parameters:
                _replace(dist, c10d, name,
                         c10d_wrappers.wrap_collective(original, c10d, rec, slots, works))
        for name, peer_names in POINT_TO_POINT.items():
            if hasattr(c10d, name):
                _replace(dist, c10d, name, c10d_wrappers.wrap_p2p(
                    getattr(c10d, name), c10d, rec, slots, works, peer_names))
        if hasattr(c10d, "batch_isend_irecv"):
            _replace(dist, c10d, "batch_isend_irecv", c10d_wrappers.wrap_batch_isend_irecv(
                c10d.batch_isend_irecv, c10d, rec, slots, works))
        patch_work_wait(getattr(c10d, "Work", None), rec, works)
        _replace(dist, c10d, "init_process_group", setup.wrap_init_process_group(
            c10d.init_process_group, rec, self._become_rank, self._joined))
        _replace(dist, c10d, "new_group", setup.wrap_new_group(c10d.new_group, rec, slots.slot))
        _replace(dist, c10d, "destroy_process_group",
                 setup.wrap_destroy_process_group(c10d.destroy_process_group, rec))
        if dist.is_initialized():  # installed by hand, after init_process_group
            self._joined(None)

    def _joined(self, _result: object) -> None:
        """The process group is up: a rank whose rank its arguments did not tell starts now."""
        dist = self._dist
        if self._rec.writer is None and self._become_rank is not None:
            self._become_rank(dist.get_rank(), dist.get_world_size())
        if not self._rec.enabled:
            return
        self._rec.set_rank(dist.get_rank(), dist.get_world_size())
        self.slots.rejoin()

    def patch_ddp(self, module: ModuleType) -> None:
        """Count each DDP forward that will all-reduce gradients in backward, and its
        constructor's collectives; the checks learn of each DDP module as it is wrapped, and
        see the batches it gets."""
        rec, ddp_class = self._rec, module.DistributedDataParallel
        rec.checks.use_torch(sys.modules["torch"])
        ddp_class.forward = ddp.wrap_forward(ddp_class.forward, rec, self.slots)
        ddp_class.__init__ = ddp.wrap_constructor(ddp_class.__init__, rec)
        for name in ddp.DDP_INIT_CALLS:
            wrapper = ddp.wrap_init_call(getattr(module, name, None), rec, self.slots)
            if wrapper is not None:
                setattr(module, name, wrapper)

    def patch_sampler(self, module: ModuleType) -> None:
        sampler_class = module.DistributedSampler
        sampler_class.__iter__ = wrap_sampler_iter(sampler_class.__iter__, self._rec)

    def patch_optimizer(self, module: ModuleType) -> None:
        """Count optimizer steps; the checks run after some of them."""
        self._rec.checks.use_torch(sys.modules["torch"])
        module.register_optimizer_step_post_hook(self._rec.optimizer_stepped)

    def patch_tensor(self, module: ModuleType) -> None:
        """The losses backward() is called on feed the nonfinite_loss check."""
        tensor_class = module.Tensor
        tensor_class.backward = wrap_backward(tensor_class.backward, self._rec)


def _replace(dist: ModuleType, c10d: ModuleType, name: str, wrapper: Any) -> None:
    setattr(c10d, name, wrapper)
    setattr(dist, name, wrapper)
