"""A booted Debian machine (tests/helpers/sysroot.py) under systemd-nspawn: systemd as its PID 1,
its own network (the daemons' fixed ports collide with nothing on this host) and a volatile
overlay (the cached root is never written). Commands run inside through nsenter, as root."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.sysroot import nspawn

BOOT_S = 60
POWEROFF_S = 30
# Where the boot ended. Anything else is not yet: "starting", and "offline" or nothing while
# systemd's bus does not answer (systemctl says "offline" when it cannot connect).
BOOTED = ("running", "degraded", "maintenance", "stopping")
PATH = "/opt/torch-hang-watchdog/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Machine:
    def __init__(self, proc: subprocess.Popen[bytes], console: Path) -> None:
        self.proc = proc
        self.console = console
        self.init_pid = 0

    def run(self, command: str, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """`command` (sh) inside, with a clean environment; its exit status checked."""
        out = subprocess.run(["nsenter", "-t", str(self.init_pid), "-m", "-u", "-i", "-n", "-p",
                              "env", "-i", f"PATH={PATH}", "LANG=C.UTF-8", "sh", "-c", command],
                             capture_output=True, text=True, timeout=timeout)
        if check:
            assert out.returncode == 0, f"{command}: {out.returncode}\n{out.stdout}{out.stderr}"
        return out

    def wait_booted(self) -> None:
        """Until the machine's systemd finished booting. Its PID 1 is found among nspawn's
        descendants once it is systemd; its bus answers some time after that."""
        deadline = time.monotonic() + BOOT_S
        state = ""
        while state not in BOOTED:
            assert self.proc.poll() is None, self.console.read_text()
            assert time.monotonic() < deadline, f"{state!r}\n{self.console.read_text()}"
            self.init_pid = self.init_pid or _machine_init(self.proc.pid)
            if self.init_pid:
                state = self.run("systemctl is-system-running --wait", check=False,
                                 timeout=BOOT_S).stdout.strip()
            time.sleep(0.2)
        failed = self.run("systemctl --failed --no-legend", check=False).stdout
        assert state == "running", f"{state}: {failed}"

    def poweroff(self) -> None:
        """`systemctl poweroff`; SIGKILL to nspawn (by its pid) if the machine does not end."""
        if self.proc.poll() is None and self.init_pid:
            self.run("systemctl poweroff", check=False, timeout=30)
        try:
            self.proc.wait(POWEROFF_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _machine_init(pid: int) -> int:
    """The machine's PID 1 seen from here: the descendant of nspawn (`pid`) that is PID 1 in
    its own namespace and already systemd (nspawn forks twice first); 0 while there is none."""
    todo = [pid]
    while todo:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{todo[0]}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields["NSpid"].split()[-1] == "1" and fields["Name"].strip() == "systemd":
                return todo[0]
            for task in Path(f"/proc/{todo[0]}/task").iterdir():
                todo.extend(int(child) for child in (task / "children").read_text().split())
        todo.pop(0)
    return 0


@contextlib.contextmanager
def booted(root: Path, install: Path, console: Path) -> Iterator[Machine]:
    """`root` booted, with `install` (what an operator copies onto the node) at /media/install."""
    with console.open("wb") as out:
        proc = subprocess.Popen(nspawn(root, "--boot", "--console=passive", "--volatile=overlay",
                                       "--private-network", f"--bind-ro={install}:/media/install"),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    machine = Machine(proc, console)
    try:
        machine.wait_booted()
        yield machine
    finally:
        machine.poweroff()
