"""A webhook receiver that answers each post one byte a second (run as `nobody` by
test_dripping_webhook.py). Prints `listening PORT`, then for each post `closed after N of M`
when the poster closed the connection after N bytes of the answer, or `answered M` when it
waited for all of them."""

from __future__ import annotations

import select
import socket

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
DRIP_S = 1.0


def read_post(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096) or b"\r\n\r\n"
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (more := conn.recv(65536)):
        body += more


def drip(conn: socket.socket) -> str:
    for sent in range(1, len(ANSWER) + 1):
        try:
            conn.sendall(ANSWER[sent - 1:sent])
            readable, _, _ = select.select([conn], [], [], DRIP_S)
            if readable and not conn.recv(1):
                return f"closed after {sent} of {len(ANSWER)}"
        except OSError:
            return f"closed after {sent} of {len(ANSWER)}"
    return f"answered {len(ANSWER)}"


def main() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    print("listening", server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            read_post(conn)
            print(drip(conn), flush=True)


if __name__ == "__main__":
    main()
