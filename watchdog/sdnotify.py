"""systemd's notify protocol (the daemon processes: `watchdog agent` and `watchdog coordinator`).

Under `Type=notify` systemd passes a datagram socket in $NOTIFY_SOCKET (a path, or `@name` for
an abstract socket) and, with `WatchdogSec=`, the period in $WATCHDOG_USEC. A daemon sends
newline-separated `KEY=VALUE` lines: READY=1 once it serves, WATCHDOG=1 more often than the
period, STOPPING=1 when it shuts down. Outside systemd there is no socket and nothing is sent.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"


def socket_address(value: str) -> str | None:
    """The AF_UNIX address $NOTIFY_SOCKET names (`@` starts an abstract name); None for what is
    not a unix socket (systemd may also name a vsock, which this does not speak)."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def watchdog_period(env: MutableMapping[str, str], pid: int) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of WatchdogSec, or None when systemd expects none
    from this process."""
    owner = env.get(WATCHDOG_PID_ENV)
    if owner and owner != str(pid):
        return None  # meant for another process of the service
    try:
        usec = int(env.get(WATCHDOG_USEC_ENV, ""))
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


class Notifier:
    """Sends notifications to systemd; every method is a no-op outside `Type=notify`, and none
    raises: a service manager that went away must not take the daemon with it."""

    def __init__(self, env: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        value = env.pop(SOCKET_ENV, "")  # py-spy and other children must not talk to systemd
        self.address = socket_address(value) if value else None
        if value and self.address is None:
            log.warning("$%s=%s is not a unix socket; not notifying systemd", SOCKET_ENV, value)
        self.watchdog_period = watchdog_period(env, os.getpid()) if self.address else None
        for name in (WATCHDOG_USEC_ENV, WATCHDOG_PID_ENV):
            env.pop(name, None)

    def send(self, *fields: str) -> bool:
        """Send KEY=VALUE fields in one datagram; whether it went."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto("\n".join(fields).encode(), self.address)
        except OSError as e:
            log.warning("cannot notify systemd at %s: %s", self.address.lstrip("\0"), e)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")
