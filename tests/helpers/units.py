"""The systemd units of deploy/systemd, read as systemd reads them, and a command prefix that
runs a daemon as its unit would where no systemd runs: the unit's capabilities alone, no new
privileges, MemoryDenyWriteExecute= and its system call filter (tests/helpers/seccomp.py). Not
modelled: the mount and namespace settings (ProtectSystem=, PrivateDevices=, ...) and the
other filters systemd loads (RestrictAddressFamilies=, RestrictNamespaces=, ...)."""

from __future__ import annotations

import errno
import functools
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.harness import WATCHDOG

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
BINARY = "/opt/torch-hang-watchdog/bin/watchdog"
SECCOMP = REPO / "tests" / "helpers" / "seccomp.py"


@dataclass
class Unit:
    """A unit file's [Service] settings, with continuation lines joined."""

    path: Path
    service: dict[str, list[str]]

    @classmethod
    def read(cls, name: str) -> Unit:
        path = UNITS / f"torch-hang-watchdog-{name}.service"
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        service: dict[str, list[str]] = {}
        section = ""
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line
            elif line and not line.startswith(("#", ";")) and section == "[Service]":
                key, _, value = line.partition("=")
                service.setdefault(key, []).append(value)
        return cls(path, service)

    def one(self, key: str) -> str:
        (value,) = self.service[key]
        return value

    def environment(self) -> dict[str, str]:
        return dict(item.split("=", 1) for value in self.service.get("Environment", [])
                    for item in shlex.split(value))

    def command(self, variables: dict[str, str]) -> list[str]:
        """ExecStart's words, ${NAME} replaced as systemd does, the binary this environment's."""
        words = [re.sub(r"\$\{(\w+)\}", lambda m: variables[m.group(1)], word)
                 for word in shlex.split(self.one("ExecStart"))]
        assert words[0] == BINARY
        return [*WATCHDOG, *words[1:]]

    def credentials(self) -> list[str]:
        return [value.partition(":")[0] for value in self.service["LoadCredential"]]

    def capabilities(self) -> set[str]:
        return set(self.one("CapabilityBoundingSet").split())

    def for_analysis(self, tmp: Path) -> Path:
        """A copy whose ExecStart runs this environment's `watchdog`: verify checks it exists."""
        copy = tmp / self.path.name
        here = shutil.which("watchdog", path=str(Path(sys.executable).parent))
        assert here is not None
        copy.write_text(self.path.read_text().replace(f"ExecStart={BINARY} ", f"ExecStart={here} "))
        return copy


def holding(caps: set[str]) -> list[str]:
    """setpriv leaving root `caps` alone, and no new privileges: what CapabilityBoundingSet=
    and NoNewPrivileges= leave a root service."""
    bounding = ",".join(["-all", *(f"+{c.removeprefix('CAP_').lower()}" for c in sorted(caps))])
    return ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "--no-new-privs"]


@functools.cache
def syscall_set(name: str) -> frozenset[str]:
    """The calls a name of SystemCallFilter= stands for: a call, or a @set (nested sets
    expanded) as this machine's `systemd-analyze syscall-filter` lists it."""
    if not name.startswith("@"):
        return frozenset({name})
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    entries = [line.strip() for line in out.splitlines()[1:]]
    return frozenset().union(*(syscall_set(entry) for entry in entries
                               if entry and not entry.startswith("#")))


def syscall_filter(lines: list[str]) -> tuple[bool, frozenset[str]]:
    """(allow_list, calls) from SystemCallFilter= lines, merged as systemd merges them: the first
    line decides the kind (`~`: a deny list; else an allow list, with @default in it), and each
    later line adds to the list when it is of the same kind and takes away when it is not; an
    empty line starts over. A call's own errno (`name:EPERM`) is not modelled."""
    allow_list: bool | None = None
    calls: set[str] = set()
    for line in lines:
        if not line:
            allow_list, calls = None, set()
            continue
        invert = line.startswith("~")
        if allow_list is None:
            allow_list = not invert
            calls = set(syscall_set("@default")) if allow_list else set()
        named = set().union(*(syscall_set(word) for word in line.lstrip("~").split()))
        calls = calls | named if invert != allow_list else calls - named
    assert allow_list is not None, "no SystemCallFilter="
    return allow_list, frozenset(calls)


def under_unit(unit: Unit, filter_lines: list[str] | None = None) -> list[str]:
    """A prefix that runs a command as root under `unit`'s capabilities, no_new_privs, system
    call filter (its own, or `filter_lines` in its place) and MemoryDenyWriteExecute=."""
    allow_list, calls = syscall_filter(filter_lines or unit.service["SystemCallFilter"])
    name = unit.service.get("SystemCallErrorNumber", [None])[0]
    spec = {"allow_list": allow_list, "syscalls": sorted(calls),
            "errno": None if name is None else getattr(errno, name),
            "mdwe": unit.service.get("MemoryDenyWriteExecute") == ["yes"]}
    assert unit.one("NoNewPrivileges") == "yes"  # what lets the filter load without privilege
    return [*holding(unit.capabilities()), sys.executable, str(SECCOMP), json.dumps(spec), "--"]
