"""`watchdog check`: the seed's minimal reproduction, automated (CLI process).

It checks the rendezvous settings first (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
and that the master port is free where this node hosts the store), then runs a tiny job under
torchrun and the embedded watchdog: init_process_group, all_reduce, barrier and
destroy_process_group on every rank, each timed, with NCCL_DEBUG=INFO. Exit 0 only when every
step passed on every rank; otherwise it prints the watchdog's verdict and what `watchdog
explain` makes of the job's output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from watchdog.atomic import private_file
from watchdog.cli import options
from watchdog.cli.rendezvous import (
    FAIL,
    OK,
    Check,
    Rendezvous,
    environment_checks,
    rendezvous_checks,
    rendezvous_of,
)
from watchdog.demo import MINIMAL_PREFIX, MINIMAL_SCRIPT, MINIMAL_STEPS
from watchdog.errors import ExitCode
from watchdog.explain.advice import ADVICE
from watchdog.schema import Incident

if TYPE_CHECKING:
    from watchdog.coordinator.database import Database

EXPLAINED_FINDINGS = 6


class CheckCommand:
    name = "check"
    help = "run a tiny job through init, all_reduce, barrier and destroy, and say what fails"
    description = ("The minimal reproduction, automated: checks the rendezvous settings, then runs "
                   "a tiny job through init_process_group, all_reduce, barrier and "
                   "destroy_process_group on every rank, under the watchdog. Exit code 0 only when "
                   "every step passed.")
    example = "watchdog check --nproc 4 -- --master-port=29600"
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--nproc", type=options.positive_int, metavar="N",
                       help="ranks on this node (default: one per GPU with nccl, else 2)")
        p.add_argument("--backend", choices=("gloo", "nccl"),
                       help="default: nccl where CUDA is available, else gloo")
        p.add_argument("--timeout", type=options.positive_float, default=60.0, metavar="S",
                       help="a step silent this long is a hang; the job ends after twice as long "
                            "(default 60)")
        options.add_db_option(p)
        p.add_argument("torchrun_args", nargs=argparse.REMAINDER, metavar="-- TORCHRUN_ARGS",
                       help="torchrun's options for several nodes (--nnodes, --node-rank, "
                            "--master-addr, --master-port, --rdzv-endpoint, ...)")

    def run(self, args: argparse.Namespace) -> int:
        from watchdog.coordinator.database import database_of

        database = database_of(args.db)
        torchrun_args = list(args.torchrun_args[1:] if args.torchrun_args[:1] == ["--"]
                             else args.torchrun_args)
        rendezvous = rendezvous_of(torchrun_args, os.environ)
        checks = [*environment_checks(os.environ), *rendezvous_checks(rendezvous)]
        out = sys.stdout
        for check in checks:
            _print_check(check, out)
        if any(check.level == FAIL for check in checks):
            out.write("watchdog check: FAILED before starting the job\n")
            return ExitCode.ERROR
        backend, nproc = _backend_and_nproc(args.backend, args.nproc)
        return asyncio.run(_run_job(backend, nproc, rendezvous, torchrun_args, args.timeout,
                                    database, out))


def _backend_and_nproc(backend: str | None, nproc: int | None) -> tuple[str, int]:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = backend or ("nccl" if gpus else "gloo")
    return backend, nproc or (gpus if backend == "nccl" and gpus else 2)


def _print_check(check: Check, out: TextIO) -> None:
    out.write(f"{check.level:>4}  {check.message}\n")
    if check.category and check.level != OK:
        cause, fix = ADVICE[check.category]
        out.write(f"      {check.category}: {cause}\n      fix: {fix}\n")


# --- the job ---------------------------------------------------------------------------------


async def _run_job(backend: str, nproc: int, rendezvous: Rendezvous, torchrun_args: list[str],
                   timeout: float, database: Database, out: TextIO) -> int:
    from watchdog.coordinator import StallPolicy
    from watchdog.supervise.embedded import RunOptions, run_job

    master = [] if rendezvous.given else [f"--master_addr={rendezvous.addr}",
                                          f"--master_port={rendezvous.port}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *master,
           *torchrun_args, MINIMAL_SCRIPT, "--backend", backend]
    if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        os.environ["NCCL_DEBUG"] = "INFO"  # the job's output is evidence: NCCL's too
    log = private_file("watchdog-check-", "job.log")
    out.write(f"watchdog check: {nproc} ranks on this node, {backend}, master "
              f"{rendezvous.addr}:{rendezvous.port}; the job's output goes to {log}\n")
    out.flush()
    policy = StallPolicy(floor=min(10.0, timeout), warmup=timeout)
    incidents: list[Incident] = []
    run_options = RunOptions(cmd, policy, on_hang="kill", database=database, job_log=log,
                             time_limit=2 * timeout + 30)
    code = await run_job(run_options, out, incidents)
    return report(code, nproc, _read_steps(log), incidents, log, out)


def _read_steps(log: str) -> dict[tuple[int, str], dict[str, Any]]:
    """(rank, step) -> what the rank printed about it."""
    steps: dict[tuple[int, str], dict[str, Any]] = {}
    record = re.compile(re.escape(MINIMAL_PREFIX) + r"(\{[^{}]*\})")
    with open(log, errors="replace") as f:
        for line in f:
            for match in record.finditer(line):  # ranks writing at once may share a line
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    step = json.loads(match.group(1))
                    steps[(int(step["rank"]), str(step["step"]))] = step
    return steps


def report(code: int, nproc: int, steps: Mapping[tuple[int, str], Mapping[str, Any]],
           incidents: Sequence[Incident], log: str, out: TextIO) -> int:
    """The table of steps, then the verdict: exit 0 only when every step passed everywhere."""
    passed = True
    out.write(f"\n{'step':<24}{'ranks ok':<10}slowest\n")
    for step in MINIMAL_STEPS:
        seen = [s for (_, name), s in steps.items() if name == step]
        good = [s for s in seen if not s.get("error")]
        slowest = max((float(s.get("seconds", 0.0)) for s in seen), default=None)
        passed &= len(good) >= nproc
        cell = "-" if slowest is None else f"{slowest:.3f} s"
        out.write(f"{step:<24}{f'{len(good)}/{nproc}':<10}{cell}\n")
        for s in seen:
            if s.get("error"):
                out.write(f"  rank {s.get('rank')}: {s['error']}\n")
    if passed and code == 0 and not incidents:
        out.write("\nwatchdog check: passed\n")
        return ExitCode.OK
    if not steps:
        out.write("no rank finished any step: torchrun never started its workers (its own "
                  "rendezvous waits for the other nodes, or for the master at MASTER_ADDR), or "
                  "they failed before init_process_group\n")
    _explain(log, out)
    out.write(f"\nwatchdog check: FAILED (job exit code {code}); its output is in {log}\n")
    return ExitCode.ERROR


def _explain(log: str, out: TextIO) -> None:
    """What `watchdog explain` finds in the job's output: each category once."""
    from watchdog.explain import LogFinding, explain_lines

    shown: dict[str, LogFinding] = {}
    with open(log, errors="replace") as f:
        for finding in explain_lines(line.rstrip("\n") for line in f):
            shown.setdefault(finding.category, finding)
    if shown:
        out.write("\nwatchdog explain of the job's output:\n")
    for finding in list(shown.values())[:EXPLAINED_FINDINGS]:
        out.write(f"  line {finding.line_no}: {finding.text[:200]}\n"
                  f"  {finding.category}: {finding.cause}\n  fix: {finding.fix}\n")
