"""Frames of a Python stack (stdlib only: the hook picks the frames of an exception it records
with them, the agent and the coordinator read stacks, the reports draw them): whose code a frame
is (the user's, a library's, the hook's, native), which frames of a stack count, how ranks alike
share them, and how a frame is named. What is read from a stack is kept by the stack's identity
(`by_identity`): the ranks of a large job share a few stacks.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, TypeVar

from watchdog.bounded import BoundedTable

if TYPE_CHECKING:
    from watchdog.model import Frame

# Installed packages and the standard library, on any interpreter layout; "<frozen ...>" too.
_LIBRARY_PATH = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib(64)?[/\\]python[\d.]*[/\\]|^<")
_OWN_DIR = str(Path(__file__).parent) + os.sep  # a checkout's hook wrappers sit here...
_DEMO_DIR = _OWN_DIR + "demo" + os.sep  # ...and the bundled jobs, which play user code
HOOK_DIR = _OWN_DIR + "hook" + os.sep


# The file of a frame that marks a cut, whose name says how many frames are not shown
# ("…[N outer frames not shown...]"): model.bounded_frames, the agent's reply, the incident's bound.
TRUNCATED_FILE = "<truncated>"


def hidden_by(mark_function: str) -> int:
    """The frames a cut's mark says are not shown (0 for a name that is no mark's)."""
    digits = mark_function.removeprefix("…[").split(" ", 1)[0]
    return int(digits) if digits.isdigit() else 0


def is_library_source(file: str) -> bool:
    """Installed packages, the standard library and this package's own code (its bundled jobs
    aside): anything but the user's own source."""
    own = file.startswith(_OWN_DIR) and not file.startswith(_DEMO_DIR)
    return own or _LIBRARY_PATH.search(file) is not None


def is_native_file(file: str) -> bool:
    """A shared object (libc.so.6, libtorch_cpu.so) or an unknown one: not Python source."""
    return not file.endswith((".py", ".pyw")) and not file.startswith("<")


Answer = TypeVar("Answer")
# Frames of the stacks each question's answers are kept for (`bounded`): a hundred stacks as they
# are, 32 MiB at most with every name at MAX_TEXT.
MEMO_FRAMES = 4096


def by_identity(read: Callable[[Sequence[Frame]], Answer]) -> Callable[[Sequence[Frame]], Answer]:
    """`read`, asked once per stack object: the frames of ranks alike are one shared tuple
    (the wire decodes equal stacks into one), and a verdict on 131,072 ranks asks each of them
    the same questions. Keyed by identity (a tuple of frames hashes frame by frame, in Python),
    each entry holding its stack so that its id is not reused while kept. Only tuples are kept:
    a list may change after it was asked about."""
    memo: BoundedTable[int, tuple[Sequence[Frame], Answer]] = BoundedTable(MEMO_FRAMES)

    @functools.wraps(read)
    def asked(frames: Sequence[Frame]) -> Answer:
        if type(frames) is not tuple:
            return read(frames)
        kept = memo.get(id(frames))
        if kept is not None and kept[0] is frames:
            return kept[1]
        return memo.put(id(frames), (frames, read(frames)), len(frames))[1]

    return asked


def is_library_frame(frame: Frame) -> bool:
    """Installed packages, the standard library, this package's own hook wrappers, and native
    code."""
    return _is_library_file(frame.file)


FrameKey = tuple[str, str, int | None]


def frame_key(frame: Frame) -> FrameKey:
    """A frame as ranks alike share it: a library frame without its line number (ranks waiting
    in one collective sit on different lines of its polling loop), the user's own with it."""
    return frame.function, frame.file, None if is_library_frame(frame) else frame.line


@by_identity
def stack_signature(frames: Sequence[Frame]) -> tuple[FrameKey, ...]:
    return tuple(map(frame_key, frames))


# The stacks of 16k ranks repeat a few dozen files: a diagnosis asks about each file thousands
# of times.
@functools.lru_cache(maxsize=4096)
def _is_library_file(file: str) -> bool:
    return is_library_source(file) or _is_native_file(file)


_is_native_file = functools.lru_cache(maxsize=4096)(is_native_file)


@by_identity
def python_frames(frames: Sequence[Frame]) -> Sequence[Frame]:
    """`frames` without the native ones that `py-spy --native` interleaves. Those differ from
    process to process (addresses) and from one look to the next (the syscall a wait is in), so
    stacks are compared, and collectives found, on Python frames alone."""
    if all(not _is_native_file(f.file) for f in frames):
        return frames
    return tuple(f for f in frames if not _is_native_file(f.file))


@by_identity
def top_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost Python frame that is not the hook's own wrapper around a torch call."""
    frames = python_frames(frames) or frames
    return next((f for f in frames if not f.file.startswith(HOOK_DIR)),
                frames[0] if frames else None)


@by_identity
def stuck_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost Python frame of the user's own code, else the innermost frame."""
    frames = python_frames(frames) or frames
    return next((f for f in frames if not is_library_frame(f)), frames[0] if frames else None)


def frame_site(frame: Frame) -> str:
    """'train.py:42'."""
    return f"{PurePath(frame.file).name}:{frame.line}"
