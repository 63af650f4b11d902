"""What the evidence says about one rank and its stacks (runs in the coordinator): whether it
waits in a collective, works, compiles, is stopped or wedged, and what its children and its exit
tell.

Pure functions of a rank's state and stacks. `view.RankEvidence` asks each of them once per
rank and snapshot, for the verdict engine and the incident builder alike, so that the per-rank
table an incident carries says the same thing the verdict was decided on. Frames themselves
(whose code, how named) are `watchdog.frames`'; process groups, `membership`'s.
"""

from __future__ import annotations

import functools
import re
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from watchdog.collectives import WAITS_FOR_PEERS
from watchdog.frames import HOOK_DIR, by_identity, is_library_frame, python_frames, stuck_frame
from watchdog.model import (
    DATALOADER_WORKER,
    ChildStack,
    ExitReason,
    Frame,
    GroupProgress,
    RankStack,
    RankState,
)

HEARTBEAT_STALE_S = 10.0  # the hook stamps its liveness several times a second
# "T" only: "t" is a tracing stop, which is what our own py-spy dump looks like while it runs.
_STOPPED_STATES = frozenset("T")
_COLLECTIVE_FUNCTIONS = WAITS_FOR_PEERS  # the hook records the same names as ops
# Where a rank waits for its GPU: a CUDA wait spins on the CPU, so CPU time there is no progress.
_DEVICE_WAIT_FUNCTIONS = frozenset(
    {
        "synchronize", "wait_stream", "wait_event", "item", "_local_scalar_dense",
        "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
        "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    }
)  # fmt: skip
# A rank shows progress above these; every hung rank measured at exactly zero
# (tests/bench/agent_report.py prints what each workload looks like).
BUSY_MAIN_CPU = 0.05  # cores used by the main thread
BUSY_PROCESS_CPU = 0.10  # cores used by the whole process (a writer thread, say)
BUSY_IO_RATE = 64 * 1024  # bytes/s read or written
# ...or its main thread waited, runnable, this share of the time for a CPU that other work held
# (a hung rank sleeps in its wait, and a moment's R in its state letter is no sign).
STARVED_MAIN_WAIT = 0.5
_COLLECTIVE_DEPTH = 6  # how many innermost frames may sit between the wait and the collective
# Any module of torch.distributed but its checkpointing, which writes and plans in its own
# frames (a long save is a phase, not a wait) and waits through distributed_c10d.py, which the
# collective rule sees; and its algorithms, which DDP's every forward passes through in Python
# (`Join.notify_join_context`: an evaluation sampled there is working, not waiting).
_TORCH_DISTRIBUTED = re.compile(
    r"[/\\]torch[/\\]distributed[/\\](?!checkpoint[/\\]|algorithms[/\\])")
# Where torch.compile compiles: dynamo tracing a frame, AOT autograd compiling its graphs (the
# backward lazily, at the first backward), inductor lowering, generating and building code (its
# C++ compiler runs, its cache lock, its compile-worker pool). A compiled program running shows
# none of these (inductor's generated module, AOT autograd's runtime wrappers, eval_frame): a
# rank running compiled code is judged as any other.
_COMPILE_SITE = re.compile(
    r"[/\\]torch[/\\](?:_dynamo[/\\](?:convert_frame|symbolic_convert)\.py"
    r"|_functorch[/\\]_aot_autograd[/\\]graph_compile\.py"
    r"|_inductor[/\\](?:compile_fx|codecache|cpp_builder|async_compile)\.py"
    r"|_inductor[/\\]compile_worker[/\\])")
# Waiting to take a file lock: the filelock package (torch's inductor cache and Hugging Face's
# downloads lock with it) and torch's wrapper of it. A rank waits there for the process that
# holds the lock: another rank, busy behind it, where one is.
_FILE_LOCK = re.compile(r"[/\\]filelock[/\\]|[/\\]torch[/\\]utils[/\\]_filelock\.py$")


@by_identity
def collective_frame(frames: Sequence[Frame]) -> Frame | None:
    """The torch.distributed call (or DDP backward) the innermost frames sit in, if any: the
    outermost such frame, which is the one the user called (init_process_group, not the helper
    it waits in); else the torch.distributed function they sit in (`distributed_frame`)."""
    frames = python_frames(frames)
    inside = [f for f in frames[:_COLLECTIVE_DEPTH] if _is_collective(f)]
    return inside[-1] if inside else distributed_frame(frames)


@by_identity
def distributed_frame(frames: Sequence[Frame]) -> Frame | None:
    """The torch.distributed function the innermost Python frames sit in (the hook's wrappers
    aside), if any: the outermost of those innermost torch.distributed frames, which is the one
    its caller called. The collectives torch issues from C++ wait there under no function the
    hook records or `_COLLECTIVE_FUNCTIONS` lists: DDP's constructor waits in
    `_sync_module_states` and `_verify_param_shape_across_processes`. A rank stuck in its own
    code under DDP's forward, or in a DataLoader, has other code innermost; one writing a
    distributed checkpoint does not wait (see `_TORCH_DISTRIBUTED`)."""
    found = None
    for frame in python_frames(frames):
        if frame.file.startswith(HOOK_DIR):
            continue
        if not _in_torch_distributed(frame.file):
            break
        found = frame
    return found


@functools.lru_cache(maxsize=4096)
def _in_torch_distributed(file: str) -> bool:
    return _TORCH_DISTRIBUTED.search(file) is not None


@by_identity
def compiling(frames: Sequence[Frame]) -> bool:
    """Whether the stack is inside torch.compile's compilation (see `_COMPILE_SITE`)."""
    return any(_compile_site(frame.file) for frame in frames)


def is_compiling(rank: RankState, stack: RankStack | None) -> bool:
    """Whether the rank compiles: by its stack where one was taken, which also sees a rank
    without the hook; else by its hook, which dynamo tells when a compile begins and ends."""
    if stack is not None and stack.frames:
        return compiling(stack.frames)
    return rank.compile_age is not None


@functools.lru_cache(maxsize=4096)
def _compile_site(file: str) -> bool:
    return _COMPILE_SITE.search(file) is not None


@by_identity
def waits_for_file_lock(frames: Sequence[Frame]) -> bool:
    """Whether the innermost Python frames wait to take a file lock (see `_FILE_LOCK`)."""
    return any(_FILE_LOCK.search(frame.file) is not None
               for frame in python_frames(frames)[:_COLLECTIVE_DEPTH])


def _is_collective(frame: Frame) -> bool:
    return frame.function in _COLLECTIVE_FUNCTIONS or frame.file.endswith("distributed_c10d.py")


@by_identity
def waits_on_device(frames: Sequence[Frame]) -> bool:
    """Whether the innermost frames wait for a collective or the GPU, where NCCL and CUDA spin."""
    return any(f.function in _DEVICE_WAIT_FUNCTIONS or _is_collective(f)
               for f in frames[:_COLLECTIVE_DEPTH]) or distributed_frame(frames) is not None


def progress_sign(rank: RankState, stack: RankStack | None, stalled_for: float) -> str:
    """What shows that a live rank is working though its job stalled for `stalled_for` seconds
    ('writing 41 MB/s'), or ''.

    Compiling is work, whatever its innermost frames wait for (its C++ compiler, its cache's
    lock, its worker pool). A stack that moved between samples is Python running. CPU counts
    only outside a wait for the GPU or a collective, where CUDA and NCCL spin. Reading or
    writing counts even inside one function: a checkpoint writer loops in one. Rates measured
    over a window that reaches back before the stall began show the work before it, not during
    it: they do not count. A stopped process shows nothing.
    """
    if not rank.alive or is_stopped(rank, stack):
        return ""
    signs = ["compiling (torch.compile)"] if is_compiling(rank, stack) else []
    work = rank.activity
    if 0 < work.window <= stalled_for:
        for verb, rate in (("reading", work.read_rate), ("writing", work.write_rate)):
            if rate >= BUSY_IO_RATE:
                signs.append(f"{verb} {rate / 1e6:.1f} MB/s" if rate < 1e9
                             else f"{verb} {rate / 1e9:.1f} GB/s")
        spinning = stack is not None and waits_on_device(stack.frames)
        computing = work.main_cpu >= BUSY_MAIN_CPU or work.process_cpu >= BUSY_PROCESS_CPU
        if computing and not spinning:
            signs.append(f"using {max(work.main_cpu, work.process_cpu):.0%} of a core")
        if work.main_wait >= STARVED_MAIN_WAIT and not computing and not spinning:
            # It would compute if the node gave it a core: other work starves it.
            signs.append(f"runnable, waiting for a CPU {work.main_wait:.0%} of the time")
    if work.gpu_util:
        signs.append(f"its GPU {work.gpu_util:.0f}% busy")
    if stack is not None and stack.moved:
        signs.append("its Python stack moving")
    if stack is not None:
        signs += [sign for child in stack.children for sign in _child_signs(child)]
    return ", ".join(signs)


def _child_signs(child: ChildStack) -> list[str]:
    """A child the rank waits on that works is the rank's progress: a busy DataLoader worker."""
    signs = []
    if child.cpu >= BUSY_PROCESS_CPU and child.state not in _STOPPED_STATES:
        signs.append(f"{child_name(child)} using {child.cpu:.0%} of a core")
    if child.moved:
        signs.append(f"{child_name(child)} running Python (its stack moving)")
    return signs


# What torch's main process raises when one of its DataLoader workers died (dataloader.py, and
# the SIGCHLD handler of libtorch_python).
_DEAD_WORKER = re.compile(r"DataLoader worker \(pid(?:\(s\))? (\d{1,10})[\d, ]*\) "
                          r"(?:is killed by signal: ([\w ]{1,40})"
                          r"|exited unexpectedly(?: with exit code (-?\d{1,4}))?)")
_SIGNAL_NAMES = {signal.strsignal(s) or s.name: s.name for s in signal.Signals}


@dataclass(frozen=True)
class DeadWorker:
    """A DataLoader worker whose death a rank's exception tells of."""

    pid: int
    signal: str  # e.g. SIGKILL; "" where it exited
    exit_code: int | None
    oom_killed: bool  # the OOM killer killed a process of the rank's cgroup meanwhile


def dead_worker(reason: ExitReason | None) -> DeadWorker | None:
    """The DataLoader worker that the exception a rank raised says died, if it says so."""
    found = _DEAD_WORKER.search(reason.message) if reason and reason.exception else None
    if reason is None or found is None:
        return None
    pid, killed_by, code = found.groups()
    name = _SIGNAL_NAMES.get(killed_by.strip(), killed_by.strip()) if killed_by else ""
    return DeadWorker(int(pid), name, None if code is None else int(code), reason.oom_killed)


def child_name(child: ChildStack) -> str:
    """'its DataLoader worker 1 (pid 4242)', 'its child process 4242'."""
    if child.role != DATALOADER_WORKER:
        return f"its child process {child.pid}"
    number = "" if child.worker_id is None else f" {child.worker_id}"
    return f"its DataLoader worker{number} (pid {child.pid})"


def stuck_child(stack: RankStack | None) -> tuple[ChildStack, Frame] | None:
    """The child a rank waits on that is where it is stuck, and the frame it is stuck in: the
    first that neither works nor was stopped and whose stack reaches the user's own code (an
    idle DataLoader worker waits for its next batch in torch alone)."""
    for child in stack.children if stack is not None else ():
        if _child_signs(child) or child.state in _STOPPED_STATES:
            continue
        frame = stuck_frame(child.frames)
        if frame is not None and not is_library_frame(frame):
            return child, frame
    return None


def is_stopped(rank: RankState, stack: RankStack | None) -> bool:
    stopped_by_someone = stack is not None and stack.was_stopped
    return rank.alive and (rank.proc_state in _STOPPED_STATES or stopped_by_someone)


def wedge_reason(rank: RankState, stopped: bool, progress: Callable[[], str]) -> str:
    """Why a live process cannot be making progress ('is stopped (state T)'), or '', given
    whether it is stopped (`is_stopped`) and what shows it works (`progress_sign`, asked only
    where it decides). A process in D state or with a stale heartbeat that shows progress (an
    fsync, native code working while it holds the GIL) is busy, not wedged."""
    if stopped:
        return f"is stopped (state {rank.proc_state or 'T'})"
    reason = ""
    age = rank.heartbeat_age
    if rank.alive and rank.proc_state == "D":
        reason = "is in uninterruptible sleep (state D)"
    elif rank.alive and rank.hooked and age is not None and age > HEARTBEAT_STALE_S:
        reason = f"is alive but ran no Python for {age:.0f} s (native code holds the GIL?)"
    return "" if not reason or progress() else reason


def waits_in_collective(rank: RankState, stack: RankStack | None,
                        furthest: Mapping[str, int]) -> bool:
    """Pending in a collective its hook recorded that no member of its group has gone past
    (`furthest`: see `furthest_entered`). A member past it means this rank finished it too: DDP's
    all-reduce, for one, stays pending until the optimizer step, which a rank stuck after its
    backward never reaches. Then, and for a rank reporting no group, its stack decides; for a
    rank with nothing pending, only a stack inside torch.distributed (see `distributed_frame`):
    a user's backward hook sits near `run_backward` without waiting for anyone."""
    pending = False
    for progress in rank.groups:  # a loop: asked of 131,072 ranks by every verdict
        if progress.pending:
            pending = True
            if furthest.get(progress.group, 0) <= progress.entered_seq:
                return True
    if rank.groups and not pending:
        # Outside whatever its hook recorded, a stack inside torch.distributed still waits for
        # its peers: in a collective torch issues from C++ that the hook could not record (DDP's
        # constructor, on a torch whose helpers it does not know).
        return stack is not None and distributed_frame(stack.frames) is not None
    return stack is not None and collective_frame(stack.frames) is not None


def in_open_phase(rank: RankState) -> bool:
    """Inside a declared phase (checkpoint, eval, ...) that still has time left."""
    return bool(rank.phase) and rank.phase_age < rank.phase_timeout


def finished_cleanly(rank: RankState) -> bool:
    return not rank.alive and rank.clean_exit and rank.exit_code == 0


def latest_pending(rank: RankState) -> GroupProgress | None:
    """Where the rank waits: of its pending collectives, the one it entered last."""
    pending = [progress for progress in rank.groups if progress.pending]
    return max(pending, key=lambda progress: progress.entered_at, default=None)
