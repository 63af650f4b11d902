"""A local webhook receiver for tests: an http.server in a thread that records each POST and
answers it as told, or never answers at all."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

HANG = -1  # a "status" that never answers


@dataclass
class Post:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Answers its POSTs with `statuses` in turn (the last one repeats); HANG holds the request
    open until `release` is set."""

    statuses: list[int] = field(default_factory=lambda: [200])
    posts: list[Post] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, post: Post) -> int:
        """Keep `post`; the status to answer it with."""
        with self.lock:
            self.posts.append(post)
            return self.statuses[min(len(self.posts), len(self.statuses)) - 1]

    def wait_for(self, count: int, timeout: float = 60.0) -> list[Post]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.posts) >= count:
                return self.posts
            time.sleep(0.1)
        raise AssertionError(f"{len(self.posts)} posts arrived, not {count}")


@contextmanager
def receiving(*statuses: int) -> Iterator[Receiver]:
    receiver = Receiver(list(statuses) or [200])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = receiver.record(Post(self.path, dict(self.headers), body))
            receiver.arrived.set()
            if status == HANG:
                receiver.release.wait(120)
                return
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_port}/hook/SECRET"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release.set()
        server.shutdown()
        server.server_close()
