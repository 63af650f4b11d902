"""Who a loopback caller is: the owner of its live connection to our port in the kernel's socket
table, never a closed connection's line (TIME_WAIT, listed as uid 0) nor one to another server."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

from watchdog.transport.peers import (
    endpoint,
    local_caller_refusal,
    owner,
    parse_peer,
    socket_owner,
)

# Captured from /proc/net/tcp on x86-64: root connected from 127.0.0.1:43707 (0xAABB) to a
# listener on 55241 (0xD7C9) and closed first (TIME_WAIT, its uid shown as 0); then `nobody`
# bound 43707 again and connected to a coordinator on 41067 (0xA06B): nobody's socket, and the
# coordinator's accepted end of it (owned by root, its local end the coordinator's port).
TIME_WAIT = ("   3: 0100007F:AABB 0100007F:D7C9 06 00000000:00000000 03:00001738 00000000     0  "
             "      0 0 3 00000000b557b2c8")
ACCEPTED = ("   5: 0100007F:A06B 0100007F:AABB 01 00000000:00000000 00:00000000 00000000     0  "
            "      0 900145 1 0000000058af2c04 20 0 0 10 -1")
NOBODYS = ("  16: 0100007F:AABB 0100007F:A06B 01 00000000:00000000 00:00000000 00000000 65534  "
           "      0 900152 2 00000000f7d94b33 20 0 0 10 -1")
CALLER = (ipaddress.ip_address("127.0.0.1"), 43707)
COORDINATOR_PORT = 41067
# From /proc/net/tcp6: a connection from [::1]:48830 (0xBEBE) to [::1]:34645 (0x8755), by root.
V6 = ("   1: 00000000000000000000000001000000:BEBE 00000000000000000000000001000000:8755 01 "
      "00000000:00000000 00:00000000 00000000     0        0 899355 2 000000004ec65242 20 0 0 "
      "10 -1")


def test_the_caller_is_the_owner_of_its_live_connection_to_our_port() -> None:
    assert owner([TIME_WAIT, ACCEPTED, NOBODYS], CALLER, COORDINATOR_PORT) == 65534
    assert owner([V6], (ipaddress.ip_address("::1"), 48830), 34645) == 0


def test_a_closed_connection_or_one_to_another_port_is_no_answer() -> None:
    assert owner([TIME_WAIT, ACCEPTED], CALLER, COORDINATOR_PORT) is None
    assert owner([TIME_WAIT], CALLER, 55241) is None  # TIME_WAIT, even to that port
    assert owner([NOBODYS], CALLER, 55241) is None
    assert owner([NOBODYS], (CALLER[0], 41067), 43707) is None  # the reverse direction


def test_two_matches_or_a_garbled_line_are_no_answer() -> None:
    # A second connection from the caller's port to our port at another loopback address.
    root_twin = NOBODYS.replace("0100007F:A06B", "0200007F:A06B").replace("65534", "    0")
    assert owner([NOBODYS, root_twin], CALLER, COORDINATOR_PORT) is None
    assert owner([NOBODYS, "  17: garbled"], CALLER, COORDINATOR_PORT) is None


def test_peers_as_grpc_names_them() -> None:
    assert parse_peer("ipv4:127.0.0.1:5000") == (ipaddress.ip_address("127.0.0.1"), 5000)
    assert parse_peer("ipv6:%5B::1%5D:5000") == (ipaddress.ip_address("::1"), 5000)
    assert parse_peer("ipv6:[::1]:5000") == (ipaddress.ip_address("::1"), 5000)
    assert parse_peer("ipv6:[::ffff:127.0.0.1]:5000") == (ipaddress.ip_address("127.0.0.1"), 5000)
    assert parse_peer("unix:/tmp/x.sock") is None


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"),
                                              (socket.AF_INET6, "::1")])
def test_this_processs_own_connection_is_its_own_and_no_one_elses_is_trusted(
        family: socket.AddressFamily, host: str) -> None:
    with socket.create_server((host, 0), family=family) as server, \
            socket.create_connection(server.getsockname()[:2]) as client:
        caller = endpoint(*client.getsockname()[:2])
        server_port = server.getsockname()[1]
        assert socket_owner(caller, server_port) == os.geteuid()
        assert local_caller_refusal(caller, server_port) == ""
        assert "not a caller whose socket" in local_caller_refusal(caller, server_port + 1)
    remote = local_caller_refusal((ipaddress.ip_address("10.1.2.3"), 5000), server_port)
    assert "not a caller from another machine: its operator must give it --token-file" in remote
