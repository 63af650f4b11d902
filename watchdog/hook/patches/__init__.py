"""The torch patches (run inside every training rank): one wrapper per patched torch API, each
reporting through the recorder's own methods; `install.TorchPatches` puts them in place."""

from __future__ import annotations


def drop_own_frame(error: BaseException) -> None:
    """Called in a wrapper's `except` before a bare `raise` (which adds no frame): the error
    leaves without the wrapper's frame, so that a user's traceback through a patched torch call
    shows no watchdog code to blame. Costs nothing until an exception passes."""
    if error.__traceback__ is not None:
        error.__traceback__ = error.__traceback__.tb_next
