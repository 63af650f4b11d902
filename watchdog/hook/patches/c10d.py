"""The wrappers of torch.distributed's collectives and point-to-point transfers (runs inside every
training rank).

Each counts its call on its slot (`groups`), entered before it runs and completed when it
returns, or when its work is waited for if it is async (`works`). c10d's own calls inside a
collective (all_gather_object's all_gathers) are part of the outer one: counting them would
skew the seqs of ranks taking different paths, so a call from c10d's own namespace passes.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from watchdog.collectives import SHARES_MODEL
from watchdog.hook.patches import drop_own_frame
from watchdog.hook.patches.group_slots import GroupSlots
from watchdog.hook.patches.works import PendingWorks
from watchdog.hook.recorder import Recorder

BATCH_OPS = frozenset({"isend", "irecv"})  # what batch_isend_irecv accepts


def wrap_collective(original: Callable[..., Any], c10d: ModuleType, rec: Recorder,
                    slots: GroupSlots, works: PendingWorks) -> Callable[..., Any]:
    """A collective, on its group's slot. In the step before a check, what an all_reduce
    reduces goes to the checks: gradients averaged by hand (hook/averaged.py)."""
    enter, complete, checks = rec.enter, rec.complete, rec.checks
    cached, register = slots.cache, slots.register
    op = original.__name__.encode()
    shares_model = original.__name__ in SHARES_MODEL
    averages = original.__name__ == "all_reduce"
    params = list(inspect.signature(original).parameters)
    group_at = params.index("group")
    async_at = params.index("async_op") if "async_op" in params else sys.maxsize
    c10d_globals, frame = c10d.__dict__, sys._getframe

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if not rec.enabled or frame(1).f_globals is c10d_globals:
            return original(*args, **kwargs)
        if shares_model:
            rec.grad_syncs += 1  # rec.grad_synced() without a call
        group = args[group_at] if len(args) > group_at else kwargs.get("group")
        slot = cached.get(group)
        if slot is None:
            slot = register(group, group, None)
        if slot < 0:
            return original(*args, **kwargs)
        if averages and checks.grads_due:
            rec.run_check(checks.reduced, args[0] if args else kwargs.get("tensor"), group)
        seq = enter(slot, op)
        try:
            result = original(*args, **kwargs)
        except BaseException as e:
            drop_own_frame(e)
            raise
        if args[async_at] if len(args) > async_at else kwargs.get("async_op"):
            works.until_waited(result, slot, seq)
        else:
            complete(slot, seq)
        return result

    return collective


def wrap_p2p(original: Callable[..., Any], c10d: ModuleType, rec: Recorder, slots: GroupSlots,
             works: PendingWorks, peer_names: tuple[str, str, bool]) -> Callable[..., Any]:
    """A send or receive, on its pair's slot (`peer_names`: see POINT_TO_POINT). isend and
    irecv stay pending until their wait() returns or this rank's next event; a receive from
    any source is recorded once it returns its sender."""
    peer_name, group_peer_name, asynchronous = peer_names
    op = original.__name__.encode()
    params = list(inspect.signature(original).parameters)
    group_at, peer_at = params.index("group"), params.index(peer_name)
    group_peer_at = params.index(group_peer_name)
    c10d_globals, frame = c10d.__dict__, sys._getframe

    @functools.wraps(original)
    def p2p(*args: Any, **kwargs: Any) -> Any:
        if not rec.enabled or frame(1).f_globals is c10d_globals:
            return original(*args, **kwargs)
        n = len(args)
        group = args[group_at] if n > group_at else kwargs.get("group")
        slot = slots.pair_slot(group, args[peer_at] if n > peer_at else kwargs.get(peer_name),
                               args[group_peer_at] if n > group_peer_at
                               else kwargs.get(group_peer_name))
        seq = rec.enter(slot, op) if slot >= 0 else 0
        rec.grad_synced()
        try:
            result = original(*args, **kwargs)
        except BaseException as e:
            drop_own_frame(e)
            raise
        if slot >= 0 and asynchronous:
            works.until_waited(result, slot, seq)
        elif slot >= 0:
            rec.complete(slot, seq)
        elif isinstance(result, int) and result >= 0 and rec.enabled:
            slot = slots.pair_slot(group, result, None)  # a recv from any source: now we know
            if slot >= 0:
                rec.complete(slot, rec.enter(slot, op))
        return result

    return p2p


def wrap_batch_isend_irecv(original: Callable[..., Any], c10d: ModuleType, rec: Recorder,
                           slots: GroupSlots, works: PendingWorks) -> Callable[..., Any]:
    """batch_isend_irecv: each of its sends and receives is entered on its pair's slot (its
    inner calls come from c10d, so they count nothing) and ends with its wait()."""
    c10d_globals, frame = c10d.__dict__, sys._getframe

    @functools.wraps(original)
    def batch(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
        if not rec.enabled or frame(1).f_globals is c10d_globals:
            return original(p2p_op_list, *args, **kwargs)
        entered = _enter_batch(p2p_op_list, rec, slots)
        rec.grad_synced()
        result = original(p2p_op_list, *args, **kwargs)
        if entered:
            rec.leave_pending(*entered[-1])
            works.track_batch(result, entered)
        return result

    return batch


def _enter_batch(ops: object, rec: Recorder, slots: GroupSlots) -> list[tuple[int, int]]:
    """Enter each operation of a valid batch; their (slot, seq)s. An invalid batch, which
    torch itself rejects, counts nothing."""
    if not isinstance(ops, list | tuple):
        return []
    names = [getattr(getattr(op, "op", None), "__name__", None) for op in ops]
    if not all(name in BATCH_OPS for name in names):
        return []
    entered = []
    for op, name in zip(ops, names, strict=True):
        slot = slots.pair_slot(getattr(op, "group", None), getattr(op, "peer", None),
                               getattr(op, "group_peer", None))
        if slot >= 0:
            entered.append((slot, rec.enter(slot, str(name).encode())))
    return entered
