"""Post-import callbacks (runs inside every training rank, stdlib only).

The boot sitecustomize installs the hook before the user's code imports torch, so the torch
patches wait in a `sys.meta_path` finder until their module has finished executing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

Callback = Callable[[ModuleType], None]


def after_import(callbacks: dict[str, Callback], on_error: Callable[[Exception], None]) -> None:
    """Run each callback on its module once it is imported: now if it already is."""
    waiting = {}
    for name, callback in callbacks.items():
        module = sys.modules.get(name)
        if module is None:
            waiting[name] = callback
        else:
            _run(callback, module, on_error)
    if waiting:
        sys.meta_path.insert(0, _PostImportFinder(waiting, on_error))


def _run(callback: Callback, module: ModuleType, on_error: Callable[[Exception], None]) -> None:
    try:
        callback(module)
    except Exception as e:
        on_error(e)


class _PostImportFinder:
    """Finds nothing itself: it wraps the `exec_module` of the loader another finder returns.
    (A meta path finder needs only `find_spec`; importlib.abc would add milliseconds of imports.)

    It stays in `sys.meta_path` once its work is done (costing a dict lookup per import): taking
    it out while the import system iterates that list could skip the finder after it.
    """

    def __init__(self, callbacks: dict[str, Callback], on_error: Callable[[Exception], None]):
        self._callbacks = callbacks
        self._on_error = on_error

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        callback = self._callbacks.pop(fullname, None)
        if callback is None:
            return None
        try:
            spec = self._find_elsewhere(fullname, path, target)
            if spec is not None and spec.loader is not None:
                _call_after_exec(spec.loader, callback, self._on_error)
            return spec
        except Exception as e:  # the import goes on, unpatched
            self._on_error(e)
            return None

    def _find_elsewhere(self, fullname: str, path: Sequence[str] | None,
                        target: ModuleType | None) -> ModuleSpec | None:
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec: ModuleSpec | None = find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


def _call_after_exec(loader: object, callback: Callback,
                     on_error: Callable[[Exception], None]) -> None:
    """Shadow the loader's exec_module with one that runs `callback` after it, then unshadows."""

    def exec_module(module: ModuleType) -> None:
        delattr(loader, "exec_module")
        loader.exec_module(module)  # type: ignore[attr-defined]
        _run(callback, module, on_error)

    setattr(loader, "exec_module", exec_module)  # noqa: B010 - mypy rejects assigning a method
