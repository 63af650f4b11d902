"""The wrappers of DistributedDataParallel (runs inside every training rank).

DDP issues its collectives from C++, out of Python's sight: its gradient all-reduce in backward,
its constructor's parameter shape check and broadcast. Every rank must run them, so the Python
calls that lead to them count as collectives entered on DDP's group.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

from watchdog.collectives import DDP_INIT_OP
from watchdog.hook.environment import EnvironmentRecord
from watchdog.hook.patches import drop_own_frame
from watchdog.hook.patches.group_slots import GroupSlots
from watchdog.hook.recorder import Recorder

# The collectives DDP's constructor issues from C++, through these helpers that
# torch.nn.parallel.distributed imports from torch.distributed.utils: the parameter shape check,
# then the broadcast of rank 0's parameters and buffers. Recorded under one op name, which the
# coordinator words as DDP's initial parameter broadcast.
DDP_INIT_CALLS = ("_verify_param_shape_across_processes", "_sync_module_states")
_INIT_OP = DDP_INIT_OP.encode()


def wrap_forward(original: Callable[..., Any], rec: Recorder,
                 slots: GroupSlots) -> Callable[..., Any]:
    """DDP's forward that will all-reduce gradients in backward, as a collective entered and
    pending (Python never sees it end). A training forward's batch feeds the checks when due:
    an evaluation's may well be shared."""
    checks, grad_enabled = rec.checks, sys.modules["torch"].is_grad_enabled

    @functools.wraps(original)
    def forward(ddp: Any, *inputs: Any, **kwargs: Any) -> Any:
        if rec.enabled and ddp.require_backward_grad_sync and grad_enabled():
            group = ddp.process_group
            if group is rec.ddp_group and rec._pending is None:
                rec.ddp_calls += 1  # rec.ddp_all_reduce() without a call
            else:
                slot = rec.ddp_slot if group is rec.ddp_group else slots.slot(group)
                if slot >= 0:
                    rec.ddp_all_reduce(group, slot)  # which counts as a gradient sync too
                else:
                    rec.grad_syncs += 1
            if checks.batch_due:
                rec.run_check(checks.batch, ddp, inputs, kwargs)
        try:
            return original(ddp, *inputs, **kwargs)
        except BaseException as e:
            drop_own_frame(e)
            raise

    return forward


def wrap_constructor(original: Callable[..., None], rec: Recorder,
                     environment: EnvironmentRecord) -> Callable[..., None]:
    """DDP's constructor: the checks learn of each DDP module as it is wrapped, and the
    environment of the first one's CUDA device."""
    wrapped = rec.checks.wrapped

    @functools.wraps(original)
    def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
        original(obj, *args, **kwargs)
        if rec.enabled:
            rec.run_check(wrapped, obj)
            rec.run_check(environment.at_ddp, obj)

    return __init__


def wrap_init_call(original: Any, rec: Recorder, slots: GroupSlots) -> Callable[..., Any] | None:
    """One of DDP's constructor's collectives (see DDP_INIT_CALLS), as a collective entered
    on DDP's process group and completed when it returns; None for a torch whose helper
    this hook does not know. The same helpers sync the final model of a Join, which is no
    constructor: those calls pass through unrecorded."""
    try:
        params = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):  # no such helper, or not a Python function
        return None
    if "process_group" not in params:
        return None
    group_at, frame = params.index("process_group"), sys._getframe

    @functools.wraps(original)
    def ddp_init(*args: Any, **kwargs: Any) -> Any:
        if not rec.enabled or frame(1).f_code.co_name != "__init__":
            return original(*args, **kwargs)
        group = args[group_at] if len(args) > group_at else kwargs.get("process_group")
        slot = slots.slot(group)
        if slot < 0:
            return original(*args, **kwargs)
        seq = rec.enter(slot, _INIT_OP)
        result = original(*args, **kwargs)
        rec.complete(slot, seq)
        return result

    return ddp_init
