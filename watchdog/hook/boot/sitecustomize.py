"""Installs the torch-hang-watchdog hook as Python starts (runs in every Python process that
`watchdog run` or `watchdog launch` starts, via PYTHONPATH; `install` keeps only the ranks).

It then runs the sitecustomize it shadows, if any. It never raises: a hook that fails to install
must not stop the user's program, so it says why in one line on stderr and carries on.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _install_hook() -> None:
    if os.environ.get("WATCHDOG_AUTOINSTALL") != "1":
        return
    try:
        import watchdog

        watchdog.install()
    except Exception as e:
        print(f"torch-hang-watchdog: hook not installed: {e!r}", file=sys.stderr)


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    path = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as e:
        print(f"torch-hang-watchdog: error in the shadowed sitecustomize: {e!r}", file=sys.stderr)


_install_hook()
_run_shadowed_sitecustomize()
