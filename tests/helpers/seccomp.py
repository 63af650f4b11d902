"""Runs a command under a seccomp filter built as systemd builds a unit's (libseccomp through
ctypes: what systemd itself links), for the tests that start a daemon as its unit would where no
systemd runs: `python tests/helpers/seccomp.py SPEC -- COMMAND...`, SPEC being the JSON of
`{"allow_list": bool, "syscalls": [name, ...], "errno": int | null, "mdwe": bool}`.

allow_list: every other call fails (SystemCallFilter= whose first line is not `~...`), else the
listed ones fail; errno: how they fail (SystemCallErrorNumber=), None: the process is killed, as
systemd does without one; mdwe: MemoryDenyWriteExecute=, as systemd 252 filters it. The calls
that libseccomp does not know on this architecture are skipped, as systemd skips them. The
filter needs no_new_privs (setpriv --no-new-privs) or CAP_SYS_ADMIN to load. Stdlib alone: it
runs before the package is importable, and is run by path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys
from typing import Any

ACT_ALLOW = 0x7FFF0000
ACT_KILL_PROCESS = 0x80000000
CMP_MASKED_EQ = 7
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000


class ArgCmp(ctypes.Structure):
    """libseccomp's struct scmp_arg_cmp."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def _lib() -> Any:
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    return lib


def errno_action(errno: int) -> int:
    return 0x00050000 | (errno & 0xFFFF)


def _load(lib: Any, default: int, rules: list[tuple[str, int, list[ArgCmp]]]) -> None:
    ctx = lib.seccomp_init(default)
    for name, action, conditions in rules:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # not a call of this architecture
            continue
        array = (ArgCmp * len(conditions))(*conditions)
        rc = lib.seccomp_rule_add_array(ctx, action, nr, len(conditions), array)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add({name})")
    rc = lib.seccomp_load(ctx)
    if rc < 0:
        raise OSError(-rc, "seccomp_load (no_new_privs is needed)")


def install(spec: dict[str, Any]) -> None:
    """Load the filters that `spec` describes into this process (and what it executes)."""
    lib = _lib()
    if spec["mdwe"]:  # a filter of its own, loaded first: as systemd does, the call filter last
        eperm = errno_action(1)
        _load(lib, ACT_ALLOW, [
            ("mmap", eperm, [ArgCmp(2, CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC,
                                    PROT_WRITE | PROT_EXEC)]),
            ("mprotect", eperm, [ArgCmp(2, CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)]),
            ("pkey_mprotect", eperm, [ArgCmp(2, CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)]),
            ("shmat", eperm, [ArgCmp(2, CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC)])])
    refuse = ACT_KILL_PROCESS if spec["errno"] is None else errno_action(spec["errno"])
    default, listed = (refuse, ACT_ALLOW) if spec["allow_list"] else (ACT_ALLOW, refuse)
    _load(lib, default, [(name, listed, []) for name in sorted(spec["syscalls"])])


def main(argv: list[str]) -> None:
    spec, separator, *command = argv
    assert separator == "--" and command, __doc__
    install(json.loads(spec))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
