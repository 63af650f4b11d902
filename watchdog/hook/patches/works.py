"""Async collectives and transfers, pending until their `Work.wait()` returns (runs inside every
training rank): a rank blocked in the wait stays pending, one past it completed them."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from watchdog.hook.patches import drop_own_frame
from watchdog.hook.recorder import Recorder

Ends = tuple[tuple[int, int], ...]  # the (slot, seq)s of the calls a work handle stands for


class PendingWorks:
    """The async work handles this rank has not waited for yet, and the calls each ends.
    Weak keys: a handle the program drops is forgotten, never kept alive with its tensors."""

    def __init__(self, recorder: Recorder) -> None:
        self._rec = recorder
        self.handles: weakref.WeakKeyDictionary[Any, Ends] = weakref.WeakKeyDictionary()

    def until_waited(self, work: object, slot: int, seq: int) -> None:
        """An async collective or transfer just entered: pending until `work` is waited for."""
        self._rec.leave_pending(slot, seq)
        self.track(work, ((slot, seq),))

    def track_batch(self, works: object, entered: list[tuple[int, int]]) -> None:
        """batch_isend_irecv's works: one per operation, or one for the whole batch where the
        backend coalesces it."""
        if not isinstance(works, list):
            return
        if len(works) == len(entered):
            for work, done in zip(works, entered, strict=True):
                self.track(work, (done,))
        elif len(works) == 1:
            self.track(works[0], tuple(entered))

    def track(self, work: object, ends: Ends) -> None:
        if work is None:
            return
        try:
            self.handles[work] = ends
        except TypeError:
            pass  # a handle that takes no weak reference: its wait goes unseen
        except Exception as e:
            self._rec.fail(e)


def patch_work_wait(work_class: Any, rec: Recorder,
                    works: PendingWorks) -> Callable[..., Any] | None:
    """Work.wait() returning ends the calls its handle stands for; the wrapper installed, if
    any."""
    if work_class is None:
        return None
    handles, original = works.handles, work_class.wait

    @functools.wraps(original)
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = original(work, *args, **kwargs)
        except BaseException as e:
            drop_own_frame(e)
            raise
        if handles and rec.enabled:
            try:
                ends = handles.pop(work, None)
            except TypeError:  # a handle that takes no weak reference was never tracked
                ends = None
            if ends is not None:
                rec.waited(ends)
        return result

    try:
        work_class.wait = wait
    except (TypeError, AttributeError):  # a class that cannot be patched
        return None
    return wait
