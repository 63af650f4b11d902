"""An HTTP exchange through urllib bounded as a whole (the coordinator's webhook threads):
connecting, sending and the whole answer within one deadline, through proxies as urllib finds
them. A socket's timeout bounds each read or write alone: a receiver that sent a byte before
each ran out held a webhook post as long as it liked (issue 20: 30 s at 5 s a read).

Not bounded: resolving the host's name (getaddrinfo), and connecting takes up to its timeout
for each address the name has; once connected past the deadline, the socket is shut at once.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import urllib.request
from collections.abc import Callable
from typing import Any


class Deadline:
    """Shuts the sockets of the exchanges its `opener` makes down `seconds` from now; `close`
    once they are over. It shuts down a duplicate of each descriptor, which it alone closes: it
    never hits a number that http.client closed, or TLS handed on to another socket object, and
    that now names something else."""

    def __init__(self, seconds: float) -> None:
        self.passed = False
        self._lock = threading.Lock()
        self._fds: list[int] = []
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def opener(self, *handlers: urllib.request.BaseHandler) -> urllib.request.OpenerDirector:
        """urllib's opener with `handlers`, its http and https connections watched."""
        return urllib.request.build_opener(*handlers, _HTTPHandler(self), _HTTPSHandler(self))

    def create_connection(self, address: tuple[str, int], timeout: float | None = None,
                          source_address: tuple[str, int] | None = None) -> socket.socket:
        """socket.create_connection, its socket watched from then on (shut down at once when
        connecting took the whole time)."""
        sock = socket.create_connection(address, timeout, source_address)
        with self._lock:
            self._fds.append(os.dup(sock.fileno()))
            if self.passed:
                _shut_down(self._fds[-1])
        return sock

    def _cut(self) -> None:
        with self._lock:
            self.passed = True
            for fd in self._fds:
                _shut_down(fd)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()


def _shut_down(fd: int) -> None:
    """Ends the reads and writes of every descriptor of the socket `fd` is one of."""
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the receiver
    finally:
        sock.detach()  # the descriptor stays open: the deadline closes it


def _watched(cls: type[http.client.HTTPConnection],
             deadline: Deadline) -> Callable[..., http.client.HTTPConnection]:
    """urllib's connection class `cls`, connecting through `deadline`."""
    def connection(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        conn = cls(host, **kwargs)
        # http.client's own hook for the socket it connects (and, for https, wraps).
        conn._create_connection = deadline.create_connection  # type: ignore[attr-defined]
        return conn
    return connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPSConnection, self.deadline), req)
