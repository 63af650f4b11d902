"""Shared by the security tests: attackers that run as `nobody`, the real daemons as root, and a
scratch directory both can use. What runs here runs from the copy every user may read
(tests/helpers/everyone.py), the daemons included: one package for all."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers.everyone import AS_NOBODY, attacker, checkout, python
from tests.helpers.scrape import scrape, value
from watchdog.cli.demo import free_port

WATCHDOG = [sys.executable, "-m", "watchdog"]  # as root: its py-spy is beside this interpreter
NOBODY = pwd.getpwnam("nobody").pw_uid
AS_DAEMON = ["setpriv", "--reuid=daemon", "--regid=daemon", "--clear-groups"]
T = TypeVar("T")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything of watchdog's or torchrun's, the package importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WATCHDOG_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(checkout()), PYTHONUNBUFFERED="1", **extra)
    return env


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A directory every user may write in (1777), like /tmp; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="thw-security-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def shared_base(scratch: Path) -> Path:
    """The beacon base in `scratch` as a node has it before any job starts: root's, sticky and
    open to every user (the tmpfiles entry, or the agent at its start, makes it), so that a
    user's worker may start before the agent does."""
    base = scratch / "torch-hang-watchdog"
    base.mkdir()
    base.chmod(0o1777)
    return base


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    log: Path
    address: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None,
          ready: str = "", address: str = "") -> Daemon:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env=env or clean_env(), cwd="/")
    daemon = Daemon(proc, log, address)
    if ready:
        wait_for(lambda: ready in daemon.output() or (not daemon.alive and daemon.output()),
                 f"{argv[2:4]} to start")
        assert daemon.alive, daemon.output()
    return daemon


@contextmanager
def coordinator(scratch: Path, *flags: str) -> Iterator[Daemon]:
    address = f"127.0.0.1:{free_port()}"
    daemon = spawn([*WATCHDOG, "coordinator", "--listen", address, "--db",
                    str(scratch / "incidents.db"), "--stall-timeout", "1", *flags],
                   scratch / f"coordinator-{address.rsplit(':')[1]}.log",
                   ready="listening on", address=address)
    try:
        yield daemon
    finally:
        daemon.stop()


@contextmanager
def agent(scratch: Path, beacon_dir: Path, *flags: str, name: str = "node-a",
          wrap: Sequence[str] = ()) -> Iterator[Daemon]:
    """An agent as root; `wrap`: a command that runs it (tests/helpers/units.under_unit)."""
    daemon = spawn([*wrap, *WATCHDOG, "agent", "--beacon-dir", str(beacon_dir), "--node-name", name,
                    "--interval", "0.2", *flags], scratch / f"agent-{name}.log",
                   ready="watchdog agent")
    try:
        yield daemon
    finally:
        daemon.stop()


@contextmanager
def worker(spec: dict[str, Any], as_user: list[str] | tuple[str, ...] = (),
           **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """tests/security/fake_worker.py with `spec`, as `as_user` (a setpriv prefix), until the
    block ends; it has published its beacon when the block starts."""
    popen["env"] = {**popen.get("env", clean_env()), "RANK": str(spec["rank"]),
                    "WORLD_SIZE": str(spec["world"])}  # as torchrun gives its workers
    proc = subprocess.Popen([*as_user, python(), attacker("fake_worker.py"),
                             json.dumps(spec)], stdout=subprocess.PIPE, text=True, cwd="/",
                            **popen)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready "), f"fake worker did not start: {line!r}"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def forged_beacons(beacon_dir: Path, seconds: float,
                   claims: list[tuple[int, int]]) -> Iterator[list[Path]]:
    """tests/security/beacon_forger.py as `nobody`: one beacon per (pid, world) claim, rewritten
    every second for `seconds`; the block starts once they are all there."""
    proc = subprocess.Popen([*AS_NOBODY, python(), attacker("beacon_forger.py"),
                             str(beacon_dir), str(seconds), json.dumps(claims)],
                            stdout=subprocess.PIPE, text=True, cwd="/", env=clean_env())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], f"the forger did not start: {line!r}"
        yield [Path(path) for path in line[1:]]
    finally:
        proc.kill()
        proc.wait()


def memory_mib(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory now (VmRSS), or its peak so far (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith(f"{field}:"))
    return int(kib) / 1024


def reports_taken(metrics: int) -> float:
    """Node reports the coordinator serving /metrics on port `metrics` took so far."""
    return value(scrape(metrics), "torch_hang_watchdog_reports_total") or 0.0


@contextmanager
def rogue(address: str, token: str, node: str, job_id: str) -> Iterator[str]:
    """The rogue agent, as nobody, until the block ends; yields its first line."""
    proc = subprocess.Popen([*AS_NOBODY, python(), attacker("rogue_agent.py"), address,
                             token, node, job_id], stdout=subprocess.PIPE, text=True,
                            env=clean_env(), cwd="/")
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()


def token_file(scratch: Path, name: str, owner: int = 0) -> str:
    path = scratch / name
    path.write_text(f"{name}-0123456789abcdef\n")
    path.chmod(0o600)
    os.chown(path, owner, -1)
    return str(path)


def status(address: str, *flags: str, as_user: tuple[str, ...] | list[str] = (),
           human: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*as_user, python(), "-m", "watchdog", "status", "--coordinator", address,
                           *(() if human else ("--json",)), *flags],
                          capture_output=True, text=True, timeout=60, env=clean_env(), cwd="/")


def job(address: str, job_id: str, *flags: str) -> dict[str, Any] | None:
    out = status(address, *flags)
    if out.returncode != 0:
        return None
    return next((j for j in json.loads(out.stdout)["jobs"] if j["job_id"] == job_id), None)


def verdict(address: str, job_id: str, *flags: str, timeout: float = 60.0) -> dict[str, Any]:
    """The job's view once it has a verdict."""
    def judged() -> dict[str, Any] | None:
        view = job(address, job_id, *flags)
        return view if view is not None and view["verdict"] is not None else None

    return wait_for(judged, f"a verdict on {job_id}", timeout)


def stored(scratch: Path, incident_id: str) -> str:
    """`watchdog incidents show ID --json` of the coordinator's database in `scratch`."""
    return subprocess.run([*WATCHDOG, "incidents", "show", incident_id, "--json", "--db",
                           str(scratch / "incidents.db")], capture_output=True, text=True,
                          timeout=60, env=clean_env(), check=True).stdout


def hung_job(beacon_dir: Path, job_id: str) -> list[dict[str, Any]]:
    """Two ranks: rank 0 waits in all_reduce #5, rank 1 never reached it (MISSING_RANKS)."""
    return [{"beacon_dir": str(beacon_dir), "job": job_id, "rank": rank, "world": 2,
             "groups": [["0", [0, 1], "all_reduce", 5 if rank == 0 else 4, 4]],
             "frame": "wait_for_peers" if rank == 0 else "stuck_reading_data"}
            for rank in (0, 1)]
