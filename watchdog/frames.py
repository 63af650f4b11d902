"""Whose code a Python source file is: the user's, or a library's (stdlib only: the hook picks
the frames of an exception it records with it, the coordinator the frame a verdict names)."""

from __future__ import annotations

import os
import re
from pathlib import Path

# Installed packages and the standard library, on any interpreter layout; "<frozen ...>" too.
_LIBRARY_PATH = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib(64)?[/\\]python[\d.]*[/\\]|^<")
_OWN_DIR = str(Path(__file__).parent) + os.sep  # a checkout's hook wrappers sit here...
_DEMO_DIR = _OWN_DIR + "demo" + os.sep  # ...and the bundled jobs, which play user code
HOOK_DIR = _OWN_DIR + "hook" + os.sep


def is_library_source(file: str) -> bool:
    """Installed packages, the standard library and this package's own code (its bundled jobs
    aside): anything but the user's own source."""
    own = file.startswith(_OWN_DIR) and not file.startswith(_DEMO_DIR)
    return own or _LIBRARY_PATH.search(file) is not None
