"""Which wrapper replaces which torch function, as each torch module finishes importing (runs
inside every training rank; the modules arrive as arguments, see `post_import`)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from types import FunctionType, ModuleType
from typing import Any

from watchdog.collectives import COLLECTIVES, POINT_TO_POINT
from watchdog.hook.environment import EnvironmentRecord
from watchdog.hook.patches import c10d as c10d_wrappers
from watchdog.hook.patches import compiler, ddp, group_setup
from watchdog.hook.patches.backward import wrap_backward
from watchdog.hook.patches.group_slots import GroupSlots
from watchdog.hook.patches.optimizer import wrap_step_code
from watchdog.hook.patches.sampler import wrap_sampler_iter
from watchdog.hook.patches.works import PendingWorks, patch_work_wait
from watchdog.hook.recorder import Recorder


class TorchPatches:
    """The patches of one hooked process, and the state their wrappers share: the process group
    -> beacon slot cache and the async works not waited for yet. `become_rank` starts an armed
    recorder once init_process_group tells the rank. The checks' wrappers are installed whatever
    checks run: an armed process learns its checks only when it becomes a rank."""

    def __init__(self, recorder: Recorder,
                 become_rank: group_setup.BecomeRank | None = None) -> None:
        self._rec = recorder
        self._become_rank = become_rank
        self._dist: Any = None
        self._dynamo: ModuleType | None = None
        self.slots = GroupSlots(recorder)
        self.works = PendingWorks(recorder)
        self.environment = EnvironmentRecord(recorder)
        # Each function the hook put in torch's way, with the torch function it wraps (None: a
        # hook torch itself does not have): what torch.compile traces in its place. DDP's
        # forward is not one of them (see patch_ddp).
        self.wrapped: list[tuple[Callable[..., Any], Callable[..., Any] | None]] = []

    def post_import_hooks(self) -> dict[str, Callable[[ModuleType], None]]:
        return {
            "torch.distributed": self.patch_distributed,
            "torch.nn.parallel.distributed": self.patch_ddp,
            "torch.optim.optimizer": self.patch_optimizer,
            "torch._tensor": self.patch_tensor,
            "torch.utils.data.distributed": self.patch_sampler,
            "torch._dynamo": self.patch_dynamo,
        }

    def patch_dynamo(self, dynamo: ModuleType) -> None:
        """torch.compile: it compiles what it would without the hook, and the beacon says while
        it compiles (see `compiler`)."""
        compiler.skip_package(dynamo)
        compiler.record_compiles(dynamo, self._rec)
        self._dynamo = dynamo
        for function, original in self.wrapped:
            compiler.hide(dynamo, function, original)

    def _wrapped(self, function: Callable[..., Any], original: Callable[..., Any] | None) -> None:
        """`function` now stands in torch's way instead of `original`."""
        self.wrapped.append((function, original))
        if self._dynamo is not None:
            compiler.hide(self._dynamo, function, original)

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
                self._replace(dist, c10d, name,
                              c10d_wrappers.wrap_collective(original, c10d, rec, slots, works))
        for name, peer_names in POINT_TO_POINT.items():
            if hasattr(c10d, name):
                self._replace(dist, c10d, name, c10d_wrappers.wrap_p2p(
                    getattr(c10d, name), c10d, rec, slots, works, peer_names))
        if hasattr(c10d, "batch_isend_irecv"):
            self._replace(dist, c10d, "batch_isend_irecv", c10d_wrappers.wrap_batch_isend_irecv(
                c10d.batch_isend_irecv, c10d, rec, slots, works))
        work_class = getattr(c10d, "Work", None)
        original_wait = getattr(work_class, "wait", None)
        wait = patch_work_wait(work_class, rec, works)
        if wait is not None:
            self._wrapped(wait, original_wait)
        self._replace(dist, c10d, "init_process_group", group_setup.wrap_init_process_group(
            c10d.init_process_group, rec, self._become_rank, self._joined, self.environment))
        self._replace(dist, c10d, "new_group",
                      group_setup.wrap_new_group(c10d.new_group, rec, slots.slot))
        self._replace(dist, c10d, "destroy_process_group",
                      group_setup.wrap_destroy_process_group(c10d.destroy_process_group, rec))
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
        # Not traced as DDP's own: it counts only by running. Compiled code breaks its graph
        # at it (see `compiler`), as it would inside DDP's forward anyway (torch 2.13).
        ddp_class.forward = ddp.wrap_forward(ddp_class.forward, rec, self.slots)
        original_init = ddp_class.__init__
        ddp_class.__init__ = ddp.wrap_constructor(original_init, rec, self.environment)
        self._wrapped(ddp_class.__init__, original_init)
        for name in ddp.DDP_INIT_CALLS:
            original = getattr(module, name, None)
            wrapper = ddp.wrap_init_call(original, rec, self.slots)
            if wrapper is not None:
                setattr(module, name, wrapper)
                self._wrapped(wrapper, original)

    def patch_sampler(self, module: ModuleType) -> None:
        sampler_class, original = module.DistributedSampler, module.DistributedSampler.__iter__
        sampler_class.__iter__ = wrap_sampler_iter(original, self._rec)
        self._wrapped(sampler_class.__iter__, original)

    def patch_optimizer(self, module: ModuleType) -> None:
        """Count optimizer steps; the checks run after some of them. Where torch has no step
        code function to wrap, a global step hook counts them."""
        self._rec.checks.use_torch(sys.modules["torch"])
        optimizer_class, counter = module.Optimizer, self._rec.optimizer_stepped
        original = getattr(optimizer_class, "_optimizer_step_code", None)
        if isinstance(original, FunctionType):
            optimizer_class._optimizer_step_code = wrap_step_code(original, self._rec)
            # Dynamo traces the wrapper as torch's own code: the count is what it must not
            # trace, as it traced no step hook.
            self._wrapped(optimizer_class._optimizer_step_code, original)
        else:
            module.register_optimizer_step_post_hook(counter)
        self._wrapped(counter, None)

    def patch_tensor(self, module: ModuleType) -> None:
        """The losses backward() is called on feed the nonfinite_loss check."""
        tensor_class, original = module.Tensor, module.Tensor.backward
        tensor_class.backward = wrap_backward(original, self._rec)
        self._wrapped(tensor_class.backward, original)

    def _replace(self, dist: ModuleType, c10d: ModuleType, name: str, wrapper: Any) -> None:
        original = getattr(c10d, name)
        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)
        self._wrapped(wrapper, original)
