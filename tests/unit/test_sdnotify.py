"""systemd's notify protocol over a real datagram socket in this process: what a daemon sends,
to a path or an abstract name, and what it makes of $WATCHDOG_USEC and $WATCHDOG_PID."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from watchdog.sdnotify import Notifier, socket_address, watchdog_period


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[socket.socket,
                                                                                  str]]:
    """A datagram socket as systemd binds it, and the $NOTIFY_SOCKET value naming it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        name = str(tmp_path / "notify")
        sock.bind(name)
    else:
        name = f"@watchdog-test-{os.getpid()}-{id(sock)}"
        sock.bind("\0" + name[1:])
    sock.settimeout(5)
    with sock:
        yield sock, name


def test_ready_watchdog_and_stopping_reach_the_socket(
        listener: tuple[socket.socket, str]) -> None:
    sock, name = listener
    env = {"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "30000000"}
    notifier = Notifier(env)
    assert notifier.ready("listening on 127.0.0.1:29450")
    assert notifier.watchdog()
    assert notifier.stopping()
    received = [sock.recv(4096).decode() for _ in range(3)]
    assert received == ["READY=1\nSTATUS=listening on 127.0.0.1:29450", "WATCHDOG=1",
                        "STOPPING=1"]
    assert notifier.watchdog_period == 15.0  # half of WatchdogSec
    assert env == {}  # children (py-spy) do not inherit the socket


def test_outside_systemd_nothing_is_sent_and_nothing_fails() -> None:
    notifier = Notifier({})
    assert notifier.address is None
    assert notifier.watchdog_period is None
    assert not notifier.ready("x")
    assert not notifier.watchdog()


def test_a_vanished_socket_is_logged_not_raised(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert not notifier.stopping()
    assert "cannot notify systemd" in caplog.text


@pytest.mark.parametrize(("value", "address"), [
    ("/run/systemd/notify", "/run/systemd/notify"),
    ("@/org/freedesktop/systemd1/notify/123", "\0/org/freedesktop/systemd1/notify/123"),
    ("vsock:2:1234", None),
])
def test_socket_addresses(value: str, address: str | None) -> None:
    assert socket_address(value) == address


@pytest.mark.parametrize(("env", "period"), [
    ({"WATCHDOG_USEC": "2000000"}, 1.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "100"}, 1.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "101"}, None),  # another process's
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_period_is_half_of_watchdog_sec_for_this_process(
        env: dict[str, str], period: float | None) -> None:
    assert watchdog_period(env, 100) == period
