"""The silent-bug checks (runs inside every training rank; torch arrives as an argument).

Bugs that never hang: replicas out of sync wherever gradients are averaged (DDP, by hand,
HSDP: hook/averaged.py), ranks that never synchronize gradients, ranks that receive identical
batches, a shuffling DistributedSampler that repeats its epoch, a DDP module whose parameters
changed after wrapping, a loss turned NaN or infinite (hook/losses.py). The hook only gathers
evidence here; the coordinator compares ranks (coordinator/silent_bugs.py).

Cost: a step where no check is due pays one integer comparison (`Recorder.check_at`), DDP's
forward a flag read and a count, an all_reduce a flag read, backward() a deque append of its
loss. At steps 8, 16, 32, 64, 128, 256 and then every K (`WATCHDOG_CHECK_EVERY`, default 200)
the training thread fingerprints each DDP module's parameters (one float32 L2 norm per
parameter, fused by `torch._foreach_norm`, plus 64 strided values of the largest one), and
those an optimizer stepped after their gradients were all-reduced in the step before, and
checks the modules' device, dtype and identity; the first training forward after that (one
that will synchronize gradients) fingerprints its batch (64 strided values of each input
tensor): about 0.1 ms for a small model, 20 ms for 100M parameters on one CPU core
(tests/bench/checks_overhead.py). The numbers stay on their device: on a GPU they are copied to
pinned memory without waiting, and the publisher thread digests them once an event says the
copy is done (hook/readback.py), so the training thread never waits for the GPU.
"""

from __future__ import annotations

import hashlib
import math
import operator
import struct
import sys
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from watchdog.beacon import CHECK_NAMES, CheckState, Fingerprint
from watchdog.hook.averaged import Reduced
from watchdog.hook.losses import Losses
from watchdog.hook.readback import ReadBack

CHECK_EVERY = 200  # optimizer steps between checks once the early ones are done (the bench)
FIRST_CHECK = 8  # the first check, then twice the step each time until K steps apart: a
# mistake made at start-up (or at a restart, which counts steps from 0 again) shows early
MAX_MODULES = 4  # DDP modules followed; later ones go unchecked
MAX_AVERAGED = 2  # process groups over which an optimizer's gradients were averaged, followed
KEEP = 3  # fingerprints kept per DDP module (or group averaged over) and kind: the coordinator
# needs one step all share
STEP_CHECKS = frozenset({"replica_desync", "duplicate_data", "ddp_module_changed"})
SAMPLED = 64  # values taken from each sampled tensor
MAX_BATCH_TENSORS = 16
MAX_PENDING = 16  # fingerprints waiting for their device copy
FULL_PRECISION = ("float32", "float64")  # norms of others are taken in float32


def parse_checks(text: str) -> tuple[frozenset[str], list[str]]:
    """The checks `WATCHDOG_CHECKS` enables, and the items it names that are no check.

    Comma-separated items applied in order to every check: `-name` switches one off, `name` or
    `+name` on, `none` and `all` every one. Empty: all of them.
    """
    enabled, unknown = set(CHECK_NAMES), []
    for item in (part.strip() for part in text.split(",")):
        name = item.lstrip("+-")
        if item in ("all", "none"):
            enabled = set(CHECK_NAMES) if item == "all" else set()
        elif name not in CHECK_NAMES:
            if item:
                unknown.append(item)
        elif item.startswith("-"):
            enabled.discard(name)
        else:
            enabled.add(name)
    return frozenset(enabled), unknown


def next_check(step: int, every: int) -> int:
    """The step of the check after the one at `step`: 8, 16, 32, 64, then every `every`. Every
    rank counts the same steps, so every rank checks at the same ones."""
    if step < FIRST_CHECK:
        return FIRST_CHECK
    return step + max(1, min(step, every))


class _Module:
    """A DDP module being followed: what its parameters were when it was wrapped."""

    __slots__ = ("batch_step", "ddp", "group", "largest", "ordinal", "wrapped")

    def __init__(self, ddp: Any, ordinal: int) -> None:
        self.ddp = weakref.ref(ddp)
        self.ordinal = ordinal
        self.group = str(ddp.process_group.group_name)
        named = _parameters(ddp)
        self.wrapped = [(name, weakref.ref(p), p.device, p.dtype) for name, p in named]
        sizes = [p.numel() for _, p in named]
        self.largest = sizes.index(max(sizes)) if sizes else 0  # gives values, besides norms
        self.batch_step = -1  # the step whose batch is still to be fingerprinted

    def changed(self, named: list[tuple[str, Any]]) -> str:
        """What about its parameters (`named`, as they are now) changed since wrapping; empty:
        nothing."""
        if len(named) != len(self.wrapped):
            return f"parameters: {len(self.wrapped)} when wrapped, {len(named)} now"
        for (name, ref, device, dtype), (_, p) in zip(self.wrapped, named, strict=True):
            replaced = ref() is not p  # (a name of its own: `is` in the `if` would narrow p)
            if replaced:
                return f"parameter {name} was replaced"
            if p.device != device:
                return f"device of {name}: {device} -> {p.device}"
            if p.dtype != dtype:
                return f"dtype of {name}: {dtype} -> {p.dtype}"
        return ""


def _parameters(ddp: Any) -> list[tuple[str, Any]]:
    """The parameters DDP synchronizes: all but those it was told to ignore."""
    ignored = getattr(ddp, "parameters_to_ignore", ())
    return [(n, p) for n, p in ddp.module.named_parameters() if n not in ignored]


class _Probe:
    """Numbers computed on the training thread, digested by the publisher once readable."""

    __slots__ = ("group", "module", "of", "prefix", "step", "values")

    def __init__(self, torch: Any, of: str, group: str, module: int, step: int, values: Any,
                 prefix: bytes) -> None:
        self.of, self.group, self.module, self.step = of, group, module, step
        self.prefix = prefix
        self.values = ReadBack(torch, values)

    def ready(self) -> bool:
        return self.values.ready()

    def fingerprint(self) -> Fingerprint:
        # Replicas gone NaN are all broken alike (NONFINITE_LOSS says where it began): one NaN.
        numbers = [x if x == x else math.nan for x in self.values.numbers()]
        data = self.prefix + struct.pack(f"<{len(numbers)}d", *numbers)
        digest = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
        return Fingerprint(self.of, self.group, self.module, self.step, digest)


def _local(torch: Any, tensors: Iterable[Any]) -> list[Any]:
    """Dense real tensors on the CPU or a CUDA device: what can be sampled without a collective
    (a DTensor gives its local shard) or a device sync."""
    found = []
    for t in tensors:
        t = getattr(t, "_local_tensor", t)
        if (t.layout == torch.strided and t.device.type in ("cpu", "cuda") and t.numel()
                and not t.is_complex()):
            found.append(t)
    return found


def _strided(t: Any) -> Any:
    """SAMPLED values spread over the tensor (all of a smaller one): one view of a contiguous
    tensor's memory, a copy of any other."""
    numel = t.numel()
    stride = max(1, numel // SAMPLED)
    if not t.is_contiguous():
        return t.reshape(-1)[::stride][:SAMPLED]
    return t.as_strided((min(SAMPLED, numel),), (stride,), t.storage_offset())


def parameter_values(torch: Any, parameters: list[Any], largest: int) -> Any | None:
    """The numbers a module's parameter fingerprint digests, as float64: each parameter's L2
    norm (one fused call per dtype), then strided values of the `largest` one, which carry
    signs; None when there is nothing to take (no parameter, or several devices). Call it
    under torch.no_grad()."""
    local = [t for t in _local(torch, parameters) if t.is_floating_point()]
    if not local or any(t.device != local[0].device for t in local):
        return None
    by_dtype: dict[Any, list[Any]] = {}
    for t in local:
        by_dtype.setdefault(t.dtype, []).append(t)
    parts = []
    for dtype, group in by_dtype.items():
        cast = None if str(dtype).removeprefix("torch.") in FULL_PRECISION else torch.float32
        parts.append(torch.stack(torch._foreach_norm(group, 2, dtype=cast)))
    parts.append(_strided(local[min(largest, len(local) - 1)]))
    return torch.cat(parts).double()  # cat promotes mixed dtypes


def batch_values(torch: Any, inputs: tuple[Any, ...], kwargs: Mapping[str, Any]
                 ) -> tuple[Any | None, bytes]:
    """The numbers a batch fingerprint digests, as float64 (strided values of each input tensor
    on the first one's device), and the shapes and dtypes it covers. Call it under
    torch.no_grad()."""
    tensors = _local(torch, _tensors(torch, [*inputs, *(kwargs[k] for k in sorted(kwargs))]))
    tensors = [t for t in tensors if t.device == tensors[0].device][:MAX_BATCH_TENSORS]
    if not tensors:
        return None, b""
    shapes = repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()
    return torch.cat([_strided(t) for t in tensors]).double(), shapes


def _tensors(torch: Any, values: list[Any]) -> Iterator[Any]:
    """The tensors among forward's arguments, and inside a list, tuple or dict among them."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list | tuple | dict):
            items = value.values() if isinstance(value, dict) else value
            yield from (item for item in items if isinstance(item, torch.Tensor))


class Checks:
    """The checks of one rank. The training thread calls `wrapped`, `stepped`, `batch`,
    `reduced` and `sampler_iterated` (through the torch patches); the publisher thread calls
    `collect`. One object for the life of the process: the patches bind it when torch is
    imported, before an armed process (mp.spawn's) knows its checks (`configure`)."""

    # batch_due, grads_due and losses are read in every step: slots make each read one load.
    __slots__ = ("_change", "_due", "_ever_synced", "_modules", "_optimizers", "_pending",
                 "_prints", "_reduced", "_reuse_epoch", "_reuse_step", "_reuses", "_samplers",
                 "_steps", "_taken", "_wrapped", "batch_due", "enabled", "every", "grads_due",
                 "losses", "torch")

    def __init__(self, enabled: frozenset[str], every: int, steps: Callable[[], int]) -> None:
        self.enabled = enabled
        self.every = every
        self.torch: Any = None  # given when torch is patched (`use_torch`): imported by then
        self.batch_due = False  # read in every DDP forward: a batch is to be fingerprinted
        self.grads_due = False  # read in every all_reduce: what it reduces is to be remembered
        self.losses = Losses()
        self._steps = steps
        self._due = FIRST_CHECK
        self._modules: list[_Module] = []
        self._wrapped = 0
        self._reduced = Reduced()
        self._optimizers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._pending: deque[_Probe] = deque(maxlen=MAX_PENDING)
        self._prints: dict[tuple[int, str, str], deque[Fingerprint]] = {}
        self._taken = 0
        # Each shuffling sampler's last epoch and the iterator it returned for it: a list
        # iterator drops its list once exhausted, so this keeps at most one unfinished epoch.
        self._samplers: weakref.WeakKeyDictionary[Any, tuple[int, Iterator[Any]]] = (
            weakref.WeakKeyDictionary())
        self._reuses, self._reuse_step, self._reuse_epoch = 0, 0, 0
        self._change: tuple[int, int, str, str] | None = None  # step, module, group, what
        self._ever_synced = False
        self.configure(enabled, every)

    def configure(self, enabled: frozenset[str], every: int) -> None:
        """Run the checks `enabled` (of CHECK_NAMES), every `every` steps once past the first."""
        self.enabled, self.every = enabled, every
        self.losses.watching = "nonfinite_loss" in enabled and self.losses.first[0] < 0

    @property
    def first_check(self) -> int:
        """The step count at which the first check begins (the step before it: see `stepped`);
        never, with no check that runs at steps."""
        return FIRST_CHECK - 1 if self.enabled & STEP_CHECKS else sys.maxsize

    # -- training thread --
    def use_torch(self, torch: Any) -> None:
        """Compute fingerprints with `torch`, given once it is patched."""
        self.torch = torch

    def wrapped(self, ddp: Any) -> None:
        """A DistributedDataParallel module was just constructed."""
        if not self.enabled & STEP_CHECKS:
            return
        ordinal, self._wrapped = self._wrapped, self._wrapped + 1
        self._modules = [m for m in self._modules if m.ddp() is not None]
        if len(self._modules) < MAX_MODULES:
            self._modules.append(_Module(ddp, ordinal))

    def stepped(self, step: int, optimizer: Any) -> int:
        """Optimizer step `step` (by `optimizer`, None for `watchdog.step()`) reached the step
        count returned last; returns the next one. The step before a check, the all_reduce
        calls of the next are watched for gradients; after it, the checks run."""
        if step < self._due:
            self.grads_due = "replica_desync" in self.enabled
            return self._due
        self._due = next_check(step, self.every)
        try:
            self.due(step, optimizer)
        finally:
            self.grads_due = False
            self._reduced.clear()
        return self._due - 1

    def reduced(self, tensor: Any, group: Any) -> None:
        """An all_reduce of `tensor` over `group`, while gradients are watched."""
        self._reduced.add(tensor, group)

    def due(self, step: int, optimizer: Any = None) -> None:
        """Run the checks due after optimizer step `step`."""
        for module in self._modules:
            ddp = module.ddp()
            if ddp is None:
                continue
            named = _parameters(ddp)
            if "ddp_module_changed" in self.enabled and self._change is None:
                what = module.changed(named)
                if what:
                    self._change = (step, module.ordinal, module.group, what)
            if "replica_desync" in self.enabled:
                with self.torch.no_grad():
                    values = parameter_values(self.torch, [p for _, p in named], module.largest)
                if values is not None:
                    self._pending.append(_Probe(self.torch, "parameters", module.group,
                                                module.ordinal, step, values, b""))
            if "duplicate_data" in self.enabled:
                module.batch_step = step
                self.batch_due = True
        if "replica_desync" in self.enabled and optimizer is not None:
            self._averaged(step, optimizer)

    def _averaged(self, step: int, optimizer: Any) -> None:
        """Fingerprint the parameters `optimizer` stepped whose gradients were averaged by hand,
        one fingerprint per process group they were averaged over (the first MAX_AVERAGED)."""
        found = self._reduced.averaged(self.torch.distributed, optimizer)
        if not found:
            return
        ordinal = self._optimizers.setdefault(optimizer, len(self._optimizers))
        for group, params in sorted(found.items())[:MAX_AVERAGED]:
            sizes = [p.numel() for p in params]
            with self.torch.no_grad():
                values = parameter_values(self.torch, params, sizes.index(max(sizes)))
            if values is not None:
                self._pending.append(_Probe(self.torch, "optimizer", group, ordinal, step,
                                            values, b""))

    def batch(self, ddp: Any, inputs: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """DDP's forward, while a batch is due: fingerprint it if it is this module's."""
        for module in self._modules:
            if module.ddp() is ddp and module.batch_step >= 0:
                with self.torch.no_grad():
                    values, shapes = batch_values(self.torch, inputs, kwargs)
                if values is not None:
                    self._pending.append(_Probe(self.torch, "batch", module.group,
                                                module.ordinal, module.batch_step, values,
                                                shapes))
                module.batch_step = -1
        self.batch_due = any(m.batch_step >= 0 and m.ddp() is not None for m in self._modules)

    def sampler_iterated(self, sampler: Any, iterator: Iterator[Any]) -> None:
        """A DistributedSampler started an epoch. Iterating a shuffling one again with the epoch
        of an iteration that ran to its end repeats that epoch's order: set_epoch was not
        called. (An unfinished one, like a first batch peeked at, is not an epoch.)"""
        if "sampler_epoch_reused" not in self.enabled or not getattr(sampler, "shuffle", False):
            return
        epoch = int(getattr(sampler, "epoch", 0))
        previous = self._samplers.get(sampler)
        if previous is not None and previous[0] == epoch and not operator.length_hint(
                previous[1]):
            if not self._reuses:
                self._reuse_step, self._reuse_epoch = self._steps(), epoch
            self._reuses += 1
        self._samplers[sampler] = (epoch, iterator)

    # -- publisher thread --
    def read_losses(self) -> None:
        if self.losses.watching:
            self.losses.collect(self.torch)

    def collect(self, steps: int, grad_syncs: int) -> CheckState:
        """The state to publish: fingerprints whose numbers are readable by now are digested,
        losses read."""
        while self._pending and self._pending[0].ready():
            probe = self._pending.popleft()
            key = (probe.module, probe.of, probe.group)
            self._prints.setdefault(key, deque(maxlen=KEEP)).append(probe.fingerprint())
            self._taken += 1
        self._ever_synced = self._ever_synced or grad_syncs > 0
        self.read_losses()
        change = self._change or (0, 0, "", "")
        unsynced = not self._ever_synced and "no_grad_sync" in self.enabled
        return CheckState(
            enabled=tuple(name for name in CHECK_NAMES if name in self.enabled),
            taken=self._taken,
            fingerprints=tuple(fp for key in sorted(self._prints) for fp in self._prints[key]),
            unsynced_steps=steps if unsynced else 0,
            sampler_reuses=self._reuses, sampler_reuse_step=self._reuse_step,
            sampler_epoch=self._reuse_epoch, ddp_change_step=change[0],
            ddp_change_module=change[1], ddp_change_group=change[2], ddp_change=change[3],
            nonfinite_step=self.losses.first[0], nonfinite_value=self.losses.first[1])
