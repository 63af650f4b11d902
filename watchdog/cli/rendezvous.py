"""The rendezvous settings `watchdog check` looks at before it starts its job (CLI process):
where the ranks meet (torchrun's arguments, else MASTER_ADDR and MASTER_PORT), whether this
host can host the store there or reach it, and RANK, LOCAL_RANK, WORLD_SIZE of this shell. Each
failure carries the `watchdog explain` category that says what it means."""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watchdog.explain.advice import CONNECT_FAILED, ENV_MISSING, INVALID_RANK, PORT_IN_USE

DEFAULT_ADDR, DEFAULT_PORT = "127.0.0.1", 29500  # torchrun's
CONNECT_TIMEOUT_S = 3.0
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
