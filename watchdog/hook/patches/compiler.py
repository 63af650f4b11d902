"""torch.compile and the hook (runs inside every training rank): TorchDynamo compiles the torch
code the hook wraps as it would without the hook, never the hook's own; and the rank's beacon
says while it compiles. `install.TorchPatches` calls these once torch._dynamo is imported.

To TorchDynamo the hook is user code. Traced, a wrapper made it guard on the recorder's state
(a seq, a flag) and recompile the user's code at every step, and it ran the recorder's
bookkeeping as its own emulation, which raised in the user's code. So:
- dynamo skips the package's files: a frame of the hook (a wrapper that runs between two
  graphs, and what it calls) is never compiled, and compiled code breaks its graph where it
  calls the hook, which then runs as Python. That is what keeps DDP's forward counted;
- where compiled code calls a wrapper, dynamo traces a call of the torch function it wraps
  instead, so compiled code is what it would be without the hook. Inside a compiled region the
  graph runs what dynamo makes of that function (a functional collective): unrecorded;
- the optimizer step's count, which torch does not have, traces as nothing (the function it
  sits in, patches/optimizer.py, dynamo traces as torch's own).
Every API used here is looked up: a torch without one is left as it is.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from types import FunctionType, ModuleType
from typing import Any

from watchdog.hook.recorder import Recorder

# What dynamo's compile callbacks are called for that is compiling: a frame, and the backward
# of a graph compiled on its first use. Not CUDA graph recording, which runs the graph, and
# with it any collective in it: a rank hung there works at nothing.
COMPILING = frozenset({"DYNAMO", "LAZY_BACKWARD"})

# What dynamo traces in the hook's place. It fails on one in this package's files, which it
# skips ("'SkipFunctionVariable' object has no attribute 'get_code'", raised in the user's
# code): they are compiled from source, under a file name of their own.
_STAND_INS = "<torch-hang-watchdog: traced in the hook's place>"
_calling: Callable[[Callable[..., Any]], Callable[..., Any]] = eval(compile(
    "lambda original: lambda *args, **kwargs: original(*args, **kwargs)", _STAND_INS, "eval"))
_nothing: Callable[..., None] = eval(compile("lambda *args, **kwargs: None", _STAND_INS, "eval"))


def skip_package(dynamo: ModuleType) -> None:
    """Dynamo skips every file of this package, as a frame and where compiled code calls it."""
    add = getattr(getattr(dynamo, "trace_rules", None), "add", None)
    if add is not None:
        add(__name__.partition(".")[0])


def hide(dynamo: ModuleType, function: Callable[..., Any],
         original: Callable[..., Any] | None) -> None:
    """Where compiled code calls `function` (a wrapper), dynamo traces a call of the torch
    function it wraps; None: nothing at all (a hook that torch itself does not have)."""
    remaps = getattr(sys.modules.get("torch.distributed._functional_collectives"),
                     "traceable_collective_remaps", None)
    if isinstance(remaps, dict) and isinstance(original, FunctionType) and (
            function in remaps or original in remaps):
        # A collective that dynamo rewrites into a functional one. That rule comes after a
        # substitute's, and holds what torch.distributed had when dynamo was imported: the
        # wrapper, unless the hook was installed after.
        remaps.setdefault(function, remaps.get(original))
        return
    substitute = getattr(dynamo, "substitute_in_graph", None)
    if substitute is None:
        return
    # ValueError: a function dynamo has a rule of its own for (destroy_process_group, a graph
    # break), kept. A bound method (the step count) stands for its class's function.
    with contextlib.suppress(ValueError):
        substitute(getattr(function, "__func__", function), skip_signature_check=True)(
            _nothing if original is None else _calling(original))


def record_compiles(dynamo: ModuleType, rec: Recorder) -> None:
    """The recorder is told when dynamo's outermost compile begins and ends (its callbacks are
    called once for compiles it nests)."""
    handler = getattr(dynamo, "callback_handler", None)
    if handler is None or not hasattr(handler, "register_end_callback"):
        return

    def started(*args: object) -> None:
        try:
            trigger = getattr(getattr(args[0] if args else None, "callback_trigger", None),
                              "name", None)
            if trigger is None or trigger in COMPILING:
                rec.compile_started()
        except Exception as e:  # dynamo would raise it into the user's code
            rec.fail(e)

    handler.register_start_callback(started)
    handler.register_end_callback(lambda *_: rec.compile_ended())
