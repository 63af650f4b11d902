"""Who is calling over loopback TCP (coordinator process, Linux): the uid that owns the caller's
socket, from /proc/net/tcp and tcp6. A coordinator without a token serves only its own user and
root; gRPC tells it the caller's address and port, and the kernel's socket table tells whose
socket has that address and port.
"""

from __future__ import annotations

import ipaddress
import sys

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def parse_peer(peer: str) -> tuple[IpAddress, int] | None:
    """('127.0.0.1', 54321) from gRPC's 'ipv4:127.0.0.1:54321' or 'ipv6:[::1]:54321'."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return ipaddress.ip_address(host.strip("[]")), int(port)
    except ValueError:
        return None


def _address(hex_address: str) -> IpAddress:
    """An address as /proc/net/tcp prints it: 32-bit words in host byte order."""
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def socket_owner(address: IpAddress, port: int, tables: tuple[str, ...] = _TABLES) -> int | None:
    """The uid owning the TCP socket bound to (address, port) on this machine, if any."""
    for table in tables:
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    local, _, local_port = fields[1].partition(":")
                    if int(local_port, 16) == port and _address(local) == address:
                        return int(fields[7])
        except (OSError, ValueError, IndexError):
            continue
    return None


def loopback_caller_uid(peer: str) -> int | None:
    """The uid of a caller on this machine's loopback; None for any other caller."""
    parsed = parse_peer(peer)
    if parsed is None or not parsed[0].is_loopback:
        return None
    return socket_owner(*parsed)
