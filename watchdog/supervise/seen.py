"""What `watchdog run` says it sees (CLI process): which job it watches and how many of its ranks
report, once; when nothing the command started reported within the warm-up, that it watches
nothing, with the reason its processes show and what to do; and when a notice's rank moved on.

A rank *reports* when its hook writes a beacon that the embedded agent verified: only such
ranks are counted. `run`'s agent follows nothing else (a node agent's /proc scan also follows
torchrun workers without the hook, by their stacks alone: no steps, no collectives). Why a
process has no hook is read from its own /proc entries: its interpreter, its flags and the
environment it started with.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from agent import procfs
from watchdog import env as _env
from watchdog.coordinator.jobs import JobView
from watchdog.coordinator.stall import StallPolicy
from watchdog.schema import Incident
from watchdog.supervise.framing import threshold_text
from watchdog.supervise.inject import BOOT_DIR
from watchdog.text import printable, ranks_text

AFTER_WARMUP_S = 1.0  # how often to look, after the warm-up, for ranks that report late
MAX_PIDS = 8  # named in a line; the rest are counted

LIKELY = ("a launcher or wrapper that replaces PYTHONPATH or the environment; a container or "
          "ssh hop that does not pass them on; workers started with python -I, -E or -S; a "
          "worker that is not Python")
HOOK_FAILED = ("nothing keeps the hook out: their output says why it did not install "
               "('torch-hang-watchdog: hook not installed')")
NOT_A_RANK = ("nothing keeps the hook out, and a process reports once it is a rank (torchrun's "
              "RANK, or from init_process_group on): not one yet")
TO_DO = ("start the workers through `watchdog launch -- CMD` where they start (inside the "
         "wrapper, the container or the ssh command), or call watchdog.install() first thing in "
         "the training script; `watchdog doctor` checks the set-up")


@dataclass(frozen=True)
class Sighting:
    """A job as the embedded coordinator sees it."""

    job_id: str
    world_size: int
    pids: frozenset[int]  # of the ranks that report

    @property
    def complete(self) -> bool:
        return len(self.pids) >= self.world_size


@dataclass(frozen=True)
class Process:
    """One process the command started, as its /proc entries show it."""

    pid: int
    name: str  # its executable's file name
    argv: tuple[str, ...]
    env: Mapping[str, str] | None  # the environment it started with; None: not ours to read

    @property
    def python(self) -> bool:
        return re.match(r"(python|pypy)", self.name) is not None

    @property
    def torchrun_worker(self) -> bool:
        return self.env is not None and _env.is_torchrun_worker(self.env)


def sighting(jobs: Iterable[JobView]) -> Sighting | None:
    """The first job whose every rank reports, else the first with one that does (each attempt
    torchrun restarts is a job of its own)."""
    seen = [Sighting(job.job_id, job.world_size, pids) for job in jobs
            if (pids := frozenset(r.pid for r in job.ranks.values() if r.hooked))]
    return next((s for s in seen if s.complete), seen[0] if seen else None)


def reached_distributed(jobs: Iterable[JobView]) -> bool:
    """Whether some rank got as far as torch.distributed (a process group, or a call to set one
    up): a rank's hook reports from interpreter start, before the script is even read."""
    return any(r.hooked and (r.groups or r.setup or r.events)
               for job in jobs for r in job.ranks.values())


def attempts_seen(jobs: Iterable[JobView]) -> int:
    """How many attempts torchrun ran, by the latest seen: each attempt is a job of its own."""
    return 1 + max((r.attempt for job in jobs for r in job.ranks.values()), default=0)


def watching_text(seen: Sighting) -> str:
    """'watching job J: 4 of 4 ranks report'."""
    return (f"watchdog: watching job {printable(seen.job_id)}: {len(seen.pids)} of "
            f"{seen.world_size} ranks report")


def moved_on_text(incident: Incident, lasted: float) -> str:
    """'rank 0 moved on after 41 s (RANK_BUSY notice 3f2a...)': a notice's rank went on; or the
    job went on after a hang verdict, which it thereby contradicted."""
    ident, kind = printable(incident["id"]), printable(incident["kind"])
    if "resumed_at" in incident:
        after = incident["resumed_at"] - incident["detected_at"]
        return (f"watchdog: the job moved on {after:.0f} s after hang incident {ident} ({kind}), "
                f"with nobody acting on it: it was not hung after all (quiet for {lasted:.0f} s "
                "in all; the incident now records resumed_at)")
    return (f"watchdog: {ranks_text(incident['culprit_ranks'])} moved on after {lasted:.0f} s "
            f"({kind} notice {ident})")


def partly_text(seen: Sighting, waited: float, processes: Sequence[Process]) -> str:
    """The warm-up ended with only some ranks reporting: how many, and why the command's
    torchrun workers that do not report show no hook, where some do not."""
    lines = [f"{watching_text(seen)} after {waited:.0f} s; the others are not seen here (on "
             "other nodes, not started yet, or without the hook)"]
    silent = [p for p in processes if p.torchrun_worker and p.pid not in seen.pids]
    return "\n".join(lines + (_unhooked_lines(silent) if silent else []))


def unreported_text(waited: float, processes: Sequence[Process]) -> str:
    """Nothing the command started reported within the warm-up: what its processes show."""
    lines = [f"watchdog: nothing the command started reported in {waited:.0f} s: no rank of it "
             "is watched, and no hang in it will be named (the job goes on untouched)",
             *_unhooked_lines(processes)]
    return "\n".join(lines)


def _unhooked_lines(processes: Sequence[Process]) -> list[str]:
    """Why these processes run without the hook, grouped by reason, and what to do."""
    workers = [p for p in processes if p.torchrun_worker]
    pythons = [p for p in processes if p.python]
    candidates = workers or pythons or list(processes)
    what = "torchrun worker" if workers else "Python process" if pythons else "process"
    by_reason: dict[str, list[int]] = {}
    for process in sorted(candidates, key=lambda p: p.pid):
        by_reason.setdefault(why_unhooked(process), []).append(process.pid)
    lines = [f"watchdog:   {_count(len(pids), what)} ({_pids(pids)}): {reason}"
             for reason, pids in by_reason.items() if reason]
    if not lines or "" in by_reason:
        lines.append(f"watchdog:   likely no hook in the workers: {LIKELY}")
    if any(p.env is not None and p.env.get(_env.AUTOINSTALL) != "1" for p in workers):
        lines.append("watchdog:   a node agent (`watchdog agent`) still follows torchrun workers "
                     "without the hook, by their stacks alone; `watchdog run` counts only ranks "
                     "that report through it")
    if set(by_reason) != {NOT_A_RANK}:
        lines.append(f"watchdog:   to watch it: {TO_DO}")
    return lines


def why_unhooked(process: Process) -> str:
    """Why `process` does not report, as far as it shows; "" when it shows nothing (an
    environment not ours to read)."""
    if not process.python:
        return f"not Python ({printable(process.name)}): the hook runs in Python processes only"
    flags = interpreter_flags(process.argv)
    env = process.env
    if env is not None and env.get(_env.AUTOINSTALL) != "1":
        return (f"their environment was replaced ({_env.AUTOINSTALL} is not in it): a launcher, "
                "container or ssh hop that does not pass it on")
    if "S" in flags:
        return "started with python -S, which skips the site module that loads the hook"
    for flag in "IE":
        if flag in flags:
            return (f"started with python -{flag}, which ignores PYTHONPATH, where the hook's "
                    "loader is")
    if env is None:
        return ""
    if BOOT_DIR not in env.get("PYTHONPATH", "").split(os.pathsep):
        return ("their PYTHONPATH was replaced, without the hook's directory: a launcher or "
                "wrapper that sets its own")
    return HOOK_FAILED if process.torchrun_worker else NOT_A_RANK


def interpreter_flags(argv: Sequence[str]) -> set[str]:
    """The one-letter options given to the interpreter, before its script, -c or -m."""
    flags: set[str] = set()
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-", "--") or not arg.startswith("-") or arg.startswith("--"):
            break
        for i, letter in enumerate(arg[1:], 1):
            if letter in "cm":
                return flags
            if letter in "WX":  # their value follows, in this argument or the next
                if i == len(arg) - 1:
                    next(args, None)
                break
            flags.add(letter)
    return flags


def process_tree(root: int, proc: str = "/proc") -> list[Process]:
    """`root` and every process under it that still runs; environments only of our own."""
    children: dict[int, list[int]] = {}
    for pid in procfs.list_pids(proc):
        stat = procfs.read_stat(pid, proc)
        if stat is not None and not stat.gone:
            children.setdefault(stat.ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        found.append(_process(pid, proc))
    return [p for p in found if p is not None]


def _process(pid: int, proc: str) -> Process | None:
    try:
        name = os.path.basename(os.readlink(f"{proc}/{pid}/exe"))
        ours = os.stat(f"{proc}/{pid}").st_uid == os.geteuid()
    except OSError:
        return None  # gone, or not ours to look at
    env = procfs.read_environ(pid, proc) if ours else None
    return Process(pid, name, tuple(procfs.read_cmdline(pid, proc)), env)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 'es' if what.endswith('s') else 's'}"


def _pids(pids: Sequence[int]) -> str:
    shown = ",".join(map(str, pids[:MAX_PIDS]))
    more = f" and {len(pids) - MAX_PIDS} more" if len(pids) > MAX_PIDS else ""
    return f"pid{'s' if len(pids) > 1 else ''} {shown}{more}"


async def say_what_it_sees(jobs: Callable[[], Iterable[JobView]], root: int,
                           policy: StallPolicy, out: TextIO, tick: float) -> None:
    """Once every rank of the job reports, say so, with the threshold in force; when the
    warm-up ends first, say how many do, or, when none does, why. Runs until every rank
    reported (or it is cancelled)."""
    warmup = policy.warmup
    deadline: float | None = time.monotonic() + warmup
    while (seen := sighting(jobs())) is None or not seen.complete:
        if deadline is not None and time.monotonic() >= deadline:
            deadline = None
            processes = await asyncio.to_thread(process_tree, root)
            _say(out, unreported_text(warmup, processes) if seen is None
                 else partly_text(seen, warmup, processes))
        await asyncio.sleep(tick if deadline is not None else AFTER_WARMUP_S)
    _say(out, f"{watching_text(seen)}; {threshold_text(policy)}")


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()
