"""coordinator.deadline against a real local server that accepts and never says a word: the
exchange is cut at the deadline, in the TLS handshake as in plain HTTP, long before each read's
own timeout would have ended it (a cut ends it with EOF: a read's timeout would raise
TimeoutError)."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from watchdog.coordinator.deadline import Deadline


@pytest.fixture
def silent_port() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_an_exchange_is_cut_at_its_deadline(scheme: str, silent_port: int) -> None:
    deadline = Deadline(0.2)
    request = urllib.request.Request(f"{scheme}://127.0.0.1:{silent_port}/", data=b"{}")
    try:
        with pytest.raises((urllib.error.URLError, OSError)) as raised:
            deadline.opener().open(request, timeout=60)
    finally:
        deadline.close()
    assert deadline.passed
    reason = getattr(raised.value, "reason", raised.value)
    assert not isinstance(reason, TimeoutError), reason
