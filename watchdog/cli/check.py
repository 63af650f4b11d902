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
import errno
import json
import os
import re
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from watchdog.cli import options
from watchdog.demo import MINIMAL_PREFIX, MINIMAL_SCRIPT, MINIMAL_STEPS
from watchdog.errors import ExitCode
from watchdog.explain.advice import (
    ADVICE,
    CONNECT_FAILED,
    ENV_MISSING,
    INVALID_RANK,
    PORT_IN_USE,
)

HELP = "run a tiny job through init, all_reduce, barrier and destroy, and say what fails"
DEFAULT_ADDR, DEFAULT_PORT = "127.0.0.1", 29500  # torchrun's
CONNECT_TIMEOUT_S = 3.0
EXPLAINED_FINDINGS = 6
OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Rendezvous:
    """Where the check's ranks meet, from torchrun's arguments, else the environment."""

    addr: str
    port: int | None  # None: not a port number
    port_text: str
    nnodes: int
    node_rank: int
    given: bool  # the torchrun arguments say it: the check adds no --master_addr/--master_port

    @property
    def hosts_store(self) -> bool:
        """Whether the store is this node's to host: a single node, or node 0 of several."""
        return self.nnodes == 1 or self.node_rank == 0


@dataclass(frozen=True)
class Check:
    level: str
    message: str
    category: str = ""  # a `watchdog explain` category for what failed


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
    from watchdog.coordinator import default_db_path

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
                                args.db or default_db_path(), out))


# --- settings --------------------------------------------------------------------------------

_ADDR_OPTIONS = ("--master_addr", "--master-addr")
_PORT_OPTIONS = ("--master_port", "--master-port")
_ENDPOINT_OPTIONS = ("--rdzv_endpoint", "--rdzv-endpoint")


def _option(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of `names` in torchrun's arguments (`--x v` or `--x=v`)."""
    found = None
    for at, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            found = value if eq else (args[at + 1] if at + 1 < len(args) else "")
    return found


def rendezvous_of(args: Sequence[str], env: Mapping[str, str]) -> Rendezvous:
    endpoint = _option(args, _ENDPOINT_OPTIONS)
    addr, port = _option(args, _ADDR_OPTIONS), _option(args, _PORT_OPTIONS)
    given = endpoint is not None or addr is not None or port is not None
    if endpoint:
        host, _, endpoint_port = endpoint.rpartition(":") if ":" in endpoint else (
            endpoint, "", str(DEFAULT_PORT))
        addr, port = addr or host, port or endpoint_port
    addr = addr or env.get("MASTER_ADDR") or DEFAULT_ADDR
    port_text = port or env.get("MASTER_PORT") or str(DEFAULT_PORT)
    nnodes = (_option(args, ("--nnodes",)) or "1").rpartition(":")[2]
    node_rank = _option(args, ("--node_rank", "--node-rank")) or "0"
    return Rendezvous(addr, _port(port_text), port_text, _int(nnodes, 1), _int(node_rank, 0),
                      given)


def _int(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def _port(text: str) -> int | None:
    value = _int(text, -1)
    return value if 0 < value < 65536 else None


def environment_checks(env: Mapping[str, str]) -> list[Check]:
    """RANK, LOCAL_RANK and WORLD_SIZE as this shell sets them: torchrun sets its own for each
    worker, but a job launched by hand from here would use these."""
    present = {name: env[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if name in env}
    if not present:
        return [Check(OK, "RANK, LOCAL_RANK, WORLD_SIZE are not set here: torchrun sets them "
                          "for each worker")]
    values = {name: _int(value, -1) for name, value in present.items()}
    bad = [f"{name}={present[name]!r}" for name, value in values.items() if value < 0]
    if bad:
        return [Check(FAIL, f"{', '.join(bad)}: not a rank number", INVALID_RANK)]
    world = values.get("WORLD_SIZE")
    if "RANK" in values and world is not None and values["RANK"] >= world:
        return [Check(FAIL, f"RANK={values['RANK']} is not below WORLD_SIZE={world}",
                      INVALID_RANK)]
    if ("RANK" in values) != (world is not None):
        missing = "WORLD_SIZE" if "RANK" in values else "RANK"
        return [Check(FAIL, f"{', '.join(present)} set here but not {missing}: a job launched "
                            "by hand from here cannot join", ENV_MISSING)]
    shown = " ".join(f"{name}={value}" for name, value in present.items())
    return [Check(WARN, f"{shown} set in this shell: torchrun replaces them for its workers")]


def rendezvous_checks(rendezvous: Rendezvous) -> list[Check]:
    """MASTER_ADDR resolves, and is this host's where this node hosts the store; MASTER_PORT
    is a port, free here where this node hosts the store, reachable otherwise."""
    addr, port = rendezvous.addr, rendezvous.port
    if port is None:
        return [Check(FAIL, f"MASTER_PORT={rendezvous.port_text!r} is not a port number",
                      ENV_MISSING)]
    try:
        resolved = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except OSError as e:
        return [Check(FAIL, f"MASTER_ADDR={addr} does not resolve ({e.strerror or e})",
                      CONNECT_FAILED)]
    family, _, _, _, sockaddr = resolved[0]
    if not rendezvous.hosts_store:
        return [_reachable(family, sockaddr, addr, port)]
    if not _bindable(family, (sockaddr[0], 0)):
        return [Check(FAIL, f"MASTER_ADDR={addr} ({sockaddr[0]}) is not an address of this "
                            "host, which hosts the rendezvous store (node rank 0)",
                      CONNECT_FAILED)]
    checks = [Check(OK, f"MASTER_ADDR={addr} is this host's ({sockaddr[0]})")]
    if not _bindable(family, (sockaddr[0], port)):
        checks.append(Check(FAIL, f"MASTER_PORT={port} is already in use on this host "
                                  f"(`ss -ltnp | grep :{port}` shows by what)", PORT_IN_USE))
    else:
        checks.append(Check(OK, f"MASTER_PORT={port} is free"))
    return checks


def _bindable(family: int, address: tuple[Any, ...]) -> bool:
    """Whether a listening socket could take `address`: a port held by a listener is not, an
    address of another host is not. TIME_WAIT leftovers do not count (the store reuses them)."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
                return False
            raise
    return True


def _reachable(family: int, sockaddr: tuple[Any, ...], addr: str, port: int) -> Check:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(CONNECT_TIMEOUT_S)
        try:
            s.connect(sockaddr)
        except OSError as e:
            return Check(WARN, f"{addr}:{port} does not answer yet ({e.strerror or e}): fine if "
                               "node 0 has not started; the job waits for it", CONNECT_FAILED)
    return Check(OK, f"{addr}:{port} answers")


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
                   timeout: float, db_path: str, out: TextIO) -> int:
    from watchdog.cli.embedded import RunOptions, run_job
    from watchdog.coordinator import StallPolicy

    master = [] if rendezvous.given else [f"--master_addr={rendezvous.addr}",
                                          f"--master_port={rendezvous.port}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *master,
           *torchrun_args, MINIMAL_SCRIPT, "--backend", backend]
    if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        os.environ["NCCL_DEBUG"] = "INFO"  # the job's output is evidence: NCCL's too
    log = os.path.join(tempfile.gettempdir(), f"watchdog-check-{os.getpid()}.log")
    out.write(f"watchdog check: {nproc} ranks on this node, {backend}, master "
              f"{rendezvous.addr}:{rendezvous.port}; the job's output goes to {log}\n")
    out.flush()
    policy = StallPolicy(floor=min(10.0, timeout), warmup=timeout)
    incidents: list[dict[str, Any]] = []
    run_options = RunOptions(cmd, policy, on_hang="kill", db_path=db_path, job_log=log,
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
           incidents: Sequence[Mapping[str, Any]], log: str, out: TextIO) -> int:
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
    from watchdog.explain import Finding, explain_lines

    shown: dict[str, Finding] = {}
    with open(log, errors="replace") as f:
        for finding in explain_lines(line.rstrip("\n") for line in f):
            shown.setdefault(finding.category, finding)
    if shown:
        out.write("\nwatchdog explain of the job's output:\n")
    for finding in list(shown.values())[:EXPLAINED_FINDINGS]:
        out.write(f"  line {finding.line_no}: {finding.text[:200]}\n"
                  f"  {finding.category}: {finding.cause}\n  fix: {finding.fix}\n")
