"""Who is calling over loopback TCP (coordinator process, Linux): the uid that owns the caller's
socket, from /proc/net/tcp and tcp6. A coordinator without a token serves only its own user and
root, on gRPC and the web view alike; the server knows the caller's address and port, and the
kernel's socket table tells whose socket that is.

Only a connection that is up now counts: the one ESTABLISHED socket whose local end is the
caller's address and port and whose remote end is our own port on loopback. The table also
lists closed connections (TIME_WAIT, owned by uid 0 whoever made them) and sockets to other
servers that share the caller's port; trusting any of those would let a user pass for root.
More than one match, or a line that does not parse, is no answer.

The kernel hands these tables out a page at a time, and where sockets open and close between two
pages, a line can be skipped: an answer not found is looked for again before the caller is
refused (a busy coordinator refused root now and then).
"""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from collections.abc import Iterable
from urllib.parse import unquote

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[IpAddress, int]
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_ESTABLISHED = "01"
LOOKS = 5
LOOK_AGAIN_S = 0.02


def parse_peer(peer: str) -> Endpoint | None:
    """('127.0.0.1', 54321) from gRPC's 'ipv4:127.0.0.1:54321' or 'ipv6:%5B::1%5D:54321' (a URI:
    its brackets percent-encoded)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = unquote(rest).rpartition(":")
    try:
        return endpoint(host.strip("[]"), int(port))
    except ValueError:
        return None


def endpoint(host: str, port: int) -> Endpoint:
    """An address and port as a socket names them; raises ValueError for a host name."""
    return _unmapped(ipaddress.ip_address(host)), port


def _unmapped(address: IpAddress) -> IpAddress:
    """An IPv4 client of a dual-stack socket shows as ::ffff:a.b.c.d: the IPv4 address."""
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def _endpoint(text: str) -> Endpoint:
    """An endpoint as /proc/net/tcp prints it: 32-bit words in host byte order, ':', the port."""
    hex_address, _, hex_port = text.partition(":")
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return _unmapped(ipaddress.ip_address(raw)), int(hex_port, 16)


def owner(lines: Iterable[str], caller: Endpoint, server_port: int) -> int | None:
    """The uid of the one ESTABLISHED socket in `lines` (a socket table without its header)
    from `caller` to `server_port` on loopback; None for none, several, or a garbled line."""
    owners = []
    for line in lines:
        fields = line.split()
        try:
            local, remote, state, uid = (_endpoint(fields[1]), _endpoint(fields[2]), fields[3],
                                         int(fields[7]))
        except (ValueError, IndexError):
            return None
        if (state == _ESTABLISHED and local == caller and remote[1] == server_port
                and remote[0].is_loopback):
            owners.append(uid)
    return owners[0] if len(owners) == 1 else None


def socket_owner(caller: Endpoint, server_port: int,
                 tables: tuple[str, ...] = _TABLES) -> int | None:
    """The uid owning `caller`'s connection to our `server_port` on this machine (`owner`),
    looked for up to LOOKS times. Blocking."""
    for look in range(LOOKS):
        if look:
            time.sleep(LOOK_AGAIN_S)
        uid = owner(_read_tables(tables), caller, server_port)
        if uid is not None:
            return uid
    return None


def _read_tables(tables: tuple[str, ...]) -> list[str]:
    """The tables' lines, past their headers; none from a table that cannot be read."""
    lines: list[str] = []
    for table in tables:
        try:
            with open(table) as f:
                lines += f.readlines()[1:]
        except OSError:
            continue  # no IPv6 on this machine, say: the other table may still answer
    return lines


def local_caller_refusal(caller: Endpoint | None, server_port: int) -> str:
    """Why a caller may not use a daemon that has no token; "" when it may: root and our own
    user on this machine only. Reads the socket tables: blocking."""
    if caller is None or not caller[0].is_loopback:
        who = "a caller from another machine"
    else:
        uid = socket_owner(caller, server_port)
        if uid in (0, os.geteuid()):
            return ""
        who = "a caller whose socket it cannot tell" if uid is None else f"uid {uid}"
    return (f"this coordinator has no token and serves only root and uid {os.geteuid()} on its "
            f"own machine, not {who}: its operator must give it --token-file")
