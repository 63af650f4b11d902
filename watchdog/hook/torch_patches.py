"""Patches torch so its distributed work reports to the hook (runs inside every training rank).

Each patch is applied when its torch module finishes importing (see `post_import`), so the
boot sitecustomize can install the hook before torch is imported. Wrappers call the original
outside any `try`: a user's error reaches the user unchanged, while the recording itself never
raises (see `Recorder`). torch is never imported here: the modules arrive as arguments.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import time
import urllib.parse
import weakref
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from watchdog.beacon import Setup
from watchdog.hook.recorder import Recorder

COLLECTIVES = (
    "all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "gather", "scatter", "broadcast_object_list", "monitored_barrier",
    "gather_object", "scatter_object_list", "all_gather_coalesced", "all_reduce_coalesced",
    # torch 2.13's names for the two above `_tensor` ones, which FSDP2 calls from its hooks
    "all_gather_single", "reduce_scatter_single",
)
# Point-to-point calls count on a slot of their own per pair of ranks: counted on the group,
# they would put the members that take no part in them behind by one. Name -> its peer's
# parameters (global rank, rank in the group), and whether it returns before the transfer ends.
P2P = {"send": ("dst", "group_dst", False), "recv": ("src", "group_src", False),
       "isend": ("dst", "group_dst", True), "irecv": ("src", "group_src", True)}
P2P_BATCH_OPS = frozenset({"isend", "irecv"})  # what batch_isend_irecv accepts
# Collectives that mean the ranks train one model (for NO_GRAD_SYNC): they reduce gradients, or
# the model is split across ranks (FSDP's and tensor parallelism's gathers, experts' all-to-all).
# Point-to-point transfers (pipeline stages) count too. A barrier or an object gather does not.
SHARES_MODEL = frozenset({
    "all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "all_gather_into_tensor", "all_gather_single", "all_to_all",
    "all_to_all_single"})
DDP_OP = b"all_reduce"
# The collectives DDP's constructor issues from C++, through these helpers that
# torch.nn.parallel.distributed imports from torch.distributed.utils: the parameter shape check,
# then the broadcast of rank 0's parameters and buffers. Recorded under one op name, which the
# coordinator words as DDP's initial parameter broadcast (watchdog.model.DDP_INIT_OP).
DDP_INIT_CALLS = ("_verify_param_shape_across_processes", "_sync_module_states")
DDP_INIT_OP = b"ddp_init"
SHUTDOWN_GRACE_S = 60.0
MAX_CACHED_SLOTS = 256  # bounds memory when a job creates groups without end


BecomeRank = Callable[[int, int], None]  # an armed process's rank and world size, at init


class TorchPatches:
    """The patches of one hooked process, and the process group -> beacon slot cache they share.

    A slot cache key is the group argument as passed (None for the default group); a
    point-to-point key also holds the peer. Keys hold their groups alive, hence the bound.
    `become_rank` starts an armed recorder once init_process_group tells the rank.
    """

    def __init__(self, recorder: Recorder, become_rank: BecomeRank | None = None) -> None:
        self._rec = recorder
        self._become_rank = become_rank
        self._dist: Any = None
        self._slots: dict[object, int] = {}
        # The async work handles this rank has not waited for yet -> the (slot, seq)s they end.
        # Weak keys: a handle the program drops is forgotten, never kept alive with its tensors.
        self._works: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], ...]] = (
            weakref.WeakKeyDictionary())

    def post_import_hooks(self) -> dict[str, Callable[[ModuleType], None]]:
        return {
            "torch.distributed": self.patch_distributed,
            "torch.nn.parallel.distributed": self.patch_ddp,
            "torch.optim.optimizer": self.patch_optimizer,
            "torch.utils.data.distributed": self.patch_sampler,
        }

    def slot(self, group: object) -> int:
        """The beacon slot of a process group; -1 when there is nothing to record in it."""
        slot = self._slots.get(group)
        return self._register(group, group, None) if slot is None else slot

    def pair_slot(self, group: object, peer: int | None, group_peer: int | None) -> int:
        """The slot counting point-to-point calls between this rank and one peer of `group`,
        named by its global rank or its rank in `group`; -1 for a receive from any source."""
        key = (group, peer, group_peer)
        slot = self._slots.get(key)
        if slot is None:
            slot = -1 if peer is None and group_peer is None else self._register(
                key, group, (peer, group_peer))
        return slot

    def _register(self, key: object, group: object,
                  peer: tuple[int | None, int | None] | None) -> int:
        dist, writer, identity = self._dist, self._rec.writer, self._rec.identity
        if dist is None or writer is None or identity is None or not dist.is_initialized():
            return -1  # torch raises its own error for this call; try again on the next
        try:
            slot = -1
            if group != dist.GroupMember.NON_GROUP_MEMBER:
                pg: Any = dist.group.WORLD if group is None else group
                name, ranks = pg.group_name, tuple(dist.get_process_group_ranks(pg))
                if peer is not None:
                    other = peer[0] if peer[0] is not None else dist.get_global_rank(pg, peer[1])
                    ranks = tuple(sorted((dist.get_rank(), other)))
                    name = f"{name}:p2p:{ranks[0]}-{ranks[1]}"
                slot = writer.group_slot(name, ranks, identity.world_size)
        except Exception as e:
            self._rec.fail(e)
            return -1
        if len(self._slots) >= MAX_CACHED_SLOTS:
            self._slots.clear()
        self._slots[key] = slot
        return slot

    def patch_distributed(self, dist: ModuleType) -> None:
        c10d = getattr(dist, "distributed_c10d", None)
        if c10d is None:  # torch built without distributed support
            return
        self._dist = dist
        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            # A torch whose function takes no group is one this hook does not know: left alone.
            if original is not None and "group" in inspect.signature(original).parameters:
                self._replace(dist, c10d, name, self._collective(original, c10d))
        for name, (peer, group_peer, asynchronous) in P2P.items():
            if hasattr(c10d, name):
                wrapper = self._p2p(getattr(c10d, name), c10d, peer, group_peer, asynchronous)
                self._replace(dist, c10d, name, wrapper)
        if hasattr(c10d, "batch_isend_irecv"):
            self._replace(dist, c10d, "batch_isend_irecv",
                          self._p2p_batch(c10d.batch_isend_irecv, c10d))
        self._patch_work_wait(getattr(c10d, "Work", None))
        self._replace(dist, c10d, "init_process_group", self._init(c10d.init_process_group))
        self._replace(dist, c10d, "new_group", self._setting_up(c10d.new_group, self.slot))
        self._replace(dist, c10d, "destroy_process_group",
                      self._shutting_down(c10d.destroy_process_group))
        if dist.is_initialized():  # installed by hand, after init_process_group
            self._joined(None)

    @staticmethod
    def _replace(dist: ModuleType, c10d: ModuleType, name: str, wrapper: Any) -> None:
        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)

    def _init(self, original: Callable[..., Any]) -> Any:
        """init_process_group: an armed process becomes the rank it names (its arguments, the
        init method's query, or the environment), before it waits for its peers; the wait
        shows in the beacon as a set-up call, with where the peers meet."""
        rec, signature = self._rec, inspect.signature(original)

        def entering(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Setup | None:
            try:
                bound = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:
                return None  # torch raises its own error for these arguments
            rank, world_size = _rank_and_world(bound, os.environ)
            if rec.writer is None and self._become_rank is not None and rank >= 0:
                self._become_rank(rank, world_size)
            return Setup("init_process_group", time.time(), _rendezvous(bound, os.environ))

        return self._setting_up(original, self._joined, entering)

    def _joined(self, _result: object) -> None:
        """The process group is up: a rank whose rank its arguments did not tell starts now."""
        dist = self._dist
        if self._rec.writer is None and self._become_rank is not None:
            self._become_rank(dist.get_rank(), dist.get_world_size())
        if not self._rec.enabled:
            return
        self._rec.set_rank(dist.get_rank(), dist.get_world_size())
        self._slots.clear()
        self.slot(None)  # the world group shows in the beacon, at seq 0, before any collective

    def _shutting_down(self, original: Callable[..., Any]) -> Any:
        """Teardown and interpreter exit record nothing for a while: a declared phase keeps
        that silence from looking like a stall."""
        rec = self._rec

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            rec.set_phase(("shutdown", time.time(), SHUTDOWN_GRACE_S))
            return original(*args, **kwargs)

        return wrapper

    def _setting_up(self, original: Callable[..., Any], then: Callable[[Any], object],
                    entering: Callable[[tuple[Any, ...], dict[str, Any]], Setup | None]
                    | None = None) -> Any:
        """A call that sets a process group up (init_process_group, new_group), which waits
        for every member: declared in the beacon while it runs; `then` gets its result."""
        rec = self._rec
        name = original.__name__

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            declared = False
            if not rec.failed:
                try:
                    setup = entering(args, kwargs) if entering else Setup(name, time.time())
                    if setup is not None and rec.enabled:
                        rec.set_setup(setup)
                        declared = True
                except Exception as e:
                    rec.fail(e)
            try:
                result = original(*args, **kwargs)
            finally:
                if declared:
                    rec.set_setup()
            # an armed process may start at `then`; a forked child of a rank never records
            if not rec.failed and (rec.enabled or rec.writer is None):
                try:
                    then(result)
                except Exception as e:
                    rec.fail(e)
            return result

        return wrapper

    def _collective(self, original: Callable[..., Any], c10d: ModuleType) -> Any:
        rec, slots, register = self._rec, self._slots, self._register
        enter, complete = rec.enter, rec.complete
        op = original.__name__.encode()
        shares_model = original.__name__ in SHARES_MODEL
        params = list(inspect.signature(original).parameters)
        group_at = params.index("group")
        async_at = params.index("async_op") if "async_op" in params else sys.maxsize
        c10d_globals, frame = c10d.__dict__, sys._getframe

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            # c10d's own calls inside a collective (all_gather_object's all_gathers) are part of
            # the outer one: counting them would skew seqs of ranks taking different paths.
            if not rec.enabled or frame(1).f_globals is c10d_globals:
                return original(*args, **kwargs)
            if shares_model:
                rec.grad_syncs += 1
            group = args[group_at] if len(args) > group_at else kwargs.get("group")
            slot = slots.get(group)
            if slot is None:
                slot = register(group, group, None)
            if slot < 0:
                return original(*args, **kwargs)
            seq = enter(slot, op)
            result = original(*args, **kwargs)
            if args[async_at] if len(args) > async_at else kwargs.get("async_op"):
                self._pending_until_waited(result, slot, seq)
            else:
                complete(slot, seq)
            return result

        return collective

    def _p2p(self, original: Callable[..., Any], c10d: ModuleType, peer_name: str,
             group_peer_name: str, asynchronous: bool) -> Any:
        """A send or receive, on its pair's slot. isend and irecv stay pending until their
        wait() returns or this rank's next event; an irecv from any source is not recorded, as
        its sender stays unknown."""
        rec = self._rec
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
            slot = self.pair_slot(group, args[peer_at] if n > peer_at else kwargs.get(peer_name),
                                  args[group_peer_at] if n > group_peer_at
                                  else kwargs.get(group_peer_name))
            seq = rec.enter(slot, op) if slot >= 0 else 0
            rec.grad_syncs += 1
            result = original(*args, **kwargs)
            if slot >= 0 and asynchronous:
                self._pending_until_waited(result, slot, seq)
            elif slot >= 0:
                rec.complete(slot, seq)
            elif isinstance(result, int) and result >= 0 and rec.enabled:
                slot = self.pair_slot(group, result, None)  # a recv from any source: now we know
                if slot >= 0:
                    rec.complete(slot, rec.enter(slot, op))
            return result

        return p2p

    def _p2p_batch(self, original: Callable[..., Any], c10d: ModuleType) -> Any:
        """batch_isend_irecv: each of its sends and receives is entered on its pair's slot (its
        inner calls come from c10d, so they count nothing) and ends with its wait()."""
        rec = self._rec
        c10d_globals, frame = c10d.__dict__, sys._getframe

        @functools.wraps(original)
        def batch(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.enabled or frame(1).f_globals is c10d_globals:
                return original(p2p_op_list, *args, **kwargs)
            entered = self._enter_batch(p2p_op_list)
            rec.grad_syncs += 1
            works = original(p2p_op_list, *args, **kwargs)
            if entered:
                rec.leave_pending(*entered[-1])
                self._track_batch(works, entered)
            return works

        return batch

    def _enter_batch(self, ops: object) -> list[tuple[int, int]]:
        """Enter each operation of a valid batch; their (slot, seq)s. An invalid batch, which
        torch itself rejects, counts nothing."""
        if not isinstance(ops, list | tuple):
            return []
        names = [getattr(getattr(op, "op", None), "__name__", None) for op in ops]
        if not all(name in P2P_BATCH_OPS for name in names):
            return []
        entered = []
        for op, name in zip(ops, names, strict=True):
            slot = self.pair_slot(getattr(op, "group", None), getattr(op, "peer", None),
                                  getattr(op, "group_peer", None))
            if slot >= 0:
                entered.append((slot, self._rec.enter(slot, str(name).encode())))
        return entered

    def _track_batch(self, works: object, entered: list[tuple[int, int]]) -> None:
        """One work per operation, or one for the whole batch where the backend coalesces it."""
        if not isinstance(works, list):
            return
        if len(works) == len(entered):
            for work, done in zip(works, entered, strict=True):
                self._track(work, (done,))
        elif len(works) == 1:
            self._track(works[0], tuple(entered))

    def _pending_until_waited(self, work: object, slot: int, seq: int) -> None:
        """An async collective or transfer just entered: pending until `work` is waited for."""
        self._rec.leave_pending(slot, seq)
        self._track(work, ((slot, seq),))

    def _track(self, work: object, ends: tuple[tuple[int, int], ...]) -> None:
        if work is None:
            return
        try:
            self._works[work] = ends
        except TypeError:
            pass  # a handle that takes no weak reference: its wait goes unseen
        except Exception as e:
            self._rec.fail(e)

    def _patch_work_wait(self, work_class: Any) -> None:
        """Work.wait() returning ends the async collectives and transfers its handle stands
        for: a rank blocked there stays pending, one past it completed them."""
        if work_class is None:
            return
        rec, works, original = self._rec, self._works, work_class.wait

        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(work, *args, **kwargs)
            if works and rec.enabled:
                try:
                    ends = works.pop(work, None)
                except TypeError:  # a handle that takes no weak reference was never tracked
                    ends = None
                if ends is not None:
                    rec.waited(ends)
            return result

        with contextlib.suppress(TypeError, AttributeError):  # a class that cannot be patched
            work_class.wait = wait

    def patch_ddp(self, module: ModuleType) -> None:
        """Count each DDP forward that will all-reduce gradients in backward as a collective
        entered: the all-reduce runs in C++, out of Python's sight, and every rank must run it.
        So do the constructor's shape check and broadcast, which torch also issues from C++.
        The checks learn of each DDP module as it is wrapped, and see the batches it gets."""
        ddp_class = module.DistributedDataParallel
        original = ddp_class.forward
        rec, slots, register, checks = self._rec, self._slots, self._register, self._rec.checks
        checks.torch = sys.modules["torch"]
        grad_enabled = checks.torch.is_grad_enabled

        @functools.wraps(original)
        def forward(ddp: Any, *inputs: Any, **kwargs: Any) -> Any:
            if rec.enabled and ddp.require_backward_grad_sync and grad_enabled():
                rec.grad_syncs += 1
                slot = slots.get(ddp.process_group)
                if slot is None:
                    slot = register(ddp.process_group, ddp.process_group, None)
                if slot >= 0:
                    rec.enter(slot, DDP_OP, True)
                if checks.batch_due:  # a training batch: an evaluation's may well be shared
                    self._checked(checks.batch, ddp, inputs, kwargs)
            return original(ddp, *inputs, **kwargs)

        ddp_class.forward = forward
        if checks.first_check != sys.maxsize:
            ddp_class.__init__ = self._after_init(ddp_class.__init__, checks.wrapped)
        for name in DDP_INIT_CALLS:
            wrapper = self._ddp_init_call(getattr(module, name, None))
            if wrapper is not None:
                setattr(module, name, wrapper)

    def _ddp_init_call(self, original: Any) -> Any:
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
        rec, group_at, frame = self._rec, params.index("process_group"), sys._getframe

        @functools.wraps(original)
        def ddp_init(*args: Any, **kwargs: Any) -> Any:
            if not rec.enabled or frame(1).f_code.co_name != "__init__":
                return original(*args, **kwargs)
            group = args[group_at] if len(args) > group_at else kwargs.get("process_group")
            slot = self.slot(group)
            if slot < 0:
                return original(*args, **kwargs)
            seq = rec.enter(slot, DDP_INIT_OP)
            result = original(*args, **kwargs)
            rec.complete(slot, seq)
            return result

        return ddp_init

    def _checked(self, check: Callable[..., None], *args: Any) -> None:
        """A check, from the training thread: its fault disables the hook, never the job."""
        try:
            check(*args)
        except Exception as e:
            self._rec.fail(e)

    def _after_init(self, original: Callable[..., None], then: Callable[[Any], None]) -> Any:
        rec = self._rec

        @functools.wraps(original)
        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
            original(obj, *args, **kwargs)
            if rec.enabled:
                self._checked(then, obj)

        return __init__

    def patch_sampler(self, module: ModuleType) -> None:
        """A shuffling DistributedSampler iterated again with the same epoch (no set_epoch)."""
        checks = self._rec.checks
        if "sampler_epoch_reused" not in checks.enabled:
            return
        sampler_class = module.DistributedSampler
        original, rec = sampler_class.__iter__, self._rec

        @functools.wraps(original)
        def __iter__(sampler: Any) -> Any:
            iterator = original(sampler)
            if rec.enabled:
                self._checked(checks.sampler_iterated, sampler, iterator)
            return iterator

        sampler_class.__iter__ = __iter__

    def patch_optimizer(self, module: ModuleType) -> None:
        module.register_optimizer_step_post_hook(self._rec.optimizer_stepped)


def _int(value: object) -> int:
    """`value` as a whole number (a numpy integer or a numeric string too), else -1."""
    try:
        return int(str(value))
    except Exception:
        return -1


def _rank_and_world(arguments: Mapping[str, Any], env: Mapping[str, str]) -> tuple[int, int]:
    """The rank and world size init_process_group was given: its arguments, else the query of
    a tcp:// or file:// init method (`?rank=0&world_size=2`), else RANK and WORLD_SIZE (env://);
    -1 for what none of them says."""
    rank, world = _int(arguments.get("rank", -1)), _int(arguments.get("world_size", -1))
    method = arguments.get("init_method")
    if isinstance(method, str) and "?" in method:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(method).query)
        rank = rank if rank >= 0 else _int(query.get("rank", [-1])[0])
        world = world if world >= 0 else _int(query.get("world_size", [-1])[0])
    rank = rank if rank >= 0 else _int(env.get("RANK"))
    world = world if world >= 0 else _int(env.get("WORLD_SIZE"))
    return (rank, world) if rank >= 0 and world > 0 else (-1, -1)


def _rendezvous(arguments: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """Where the members meet: the init method without its query, env:// with the address it
    reads, or a store given by the program."""
    if arguments.get("store") is not None:
        return "a store the program created"
    method = arguments.get("init_method")
    if isinstance(method, str) and method and not method.startswith("env://"):
        return method.split("?", 1)[0]
    return f"env://{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
