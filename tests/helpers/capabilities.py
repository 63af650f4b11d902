"""What root can do to another user's process and files holding a few capabilities alone, as a
systemd unit's CapabilityBoundingSet= or a container's `capabilities.add` leave the agent: the
agent's own calls (py-spy, reading a worker's environment, SIGCONT, its log helper) tried
against a Python process of `nobody`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.everyone import AS_NOBODY, python
from tests.helpers.units import holding

PROBE = """
import asyncio, os, signal, subprocess, sys
from agent import procfs, userfiles, verify
pid, beacon, private, py_spy = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def attempt(name, action):
    try:
        action()
        print(name, "ok")
    except Exception as e:
        print(name, "denied", type(e).__name__)
def dump():
    subprocess.run([py_spy, "dump", "--pid", str(pid)], check=True, capture_output=True)
def environ():  # how the agent verifies a worker
    assert (procfs.read_environ(pid) or {}).get("MARK") == "worker"
attempt("ptrace", dump)
attempt("environ", environ)
attempt("signal", lambda: os.kill(pid, signal.SIGCONT))
attempt("remove", lambda: os.remove(beacon))
attempt("read_private", lambda: open(private, "rb").read())
attempt("fd_links", lambda: os.listdir(f"/proc/{pid}/fd"))
def read_as_owner():  # how the agent reads a worker's log
    owner = verify.credentials(pid)
    assert asyncio.run(userfiles.tail_as(owner, private, follow=False)) == ["x"]
attempt("read_as_owner", read_as_owner)
"""


@pytest.fixture
def other_users_worker() -> Iterator[tuple[int, Path]]:
    """A Python process of `nobody`, and a sticky 1777 directory like the beacon directory, in
    which `nobody` made its own, as its ranks do."""
    with tempfile.TemporaryDirectory(prefix="watchdog-caps-") as top:
        Path(top).chmod(0o755)
        shared = Path(top) / "beacons"
        shared.mkdir()
        shared.chmod(0o1777)
        subprocess.run([*AS_NOBODY, "mkdir", "-m", "755", str(shared / "nobody")], check=True)
        proc = subprocess.Popen([*AS_NOBODY, python(), "-c",
                                 "import time; print(flush=True); time.sleep(60)"],
                                stdout=subprocess.PIPE, env={"MARK": "worker"},
                                start_new_session=True)  # SIGCONT is free within a session
        try:
            assert proc.stdout is not None and proc.stdout.readline()  # it is running Python
            yield proc.pid, shared
        finally:
            proc.kill()
            proc.wait()


def probe(caps: set[str], pid: int, shared: Path) -> dict[str, str]:
    """What root can do to `nobody`'s process and files holding `caps` alone, as the unit's
    CapabilityBoundingSet= and NoNewPrivileges= leave it."""
    beacon = shared / "nobody" / f"job.rank0.pid{pid}.beacon"
    private = shared / "private"
    for path, mode in ((beacon, 0o644), (private, 0o600)):
        subprocess.run([*AS_NOBODY, "sh", "-c", f"umask 077; echo x > {path}; chmod "
                        f"{mode:o} {path}"], check=True)
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    out = subprocess.run([*holding(caps), sys.executable, "-c", PROBE, str(pid), str(beacon),
                          str(private), str(py_spy)],
                         capture_output=True, text=True, timeout=60, check=True)
    private.unlink(missing_ok=True)
    beacon.unlink(missing_ok=True)
    return {line.split()[0]: line.split()[1] for line in out.stdout.splitlines()}
