"""The coordinator's read-only web view (`watchdog coordinator --web-listen HOST:PORT`): stdlib
`http.server` in threads of its own, pages rendered on the server by `watchdog.report`.

Nothing here changes state: every page reads the coordinator's status (taken on its event loop,
so never while a report is being joined in) and the incident database. Routes: `/` (jobs and
recent incidents), `/jobs/<job id>`, `/incidents/<id>`, `/login`. Who may read: `auth`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from watchdog.errors import UsageError
from watchdog.model import EVERY_JOB, MAX_FULL_ROWS, StatusQuery
from watchdog.report import error_page, incident_html, job_page, jobs_page, login_page
from watchdog.report.job_pages import nav
from watchdog.report.page import CSP
from watchdog.schema import Incident, Status
from watchdog.text import parse_ranks
from watchdog.web.access import WebAuth

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32  # threads serving at once
# A connection has this long to send its whole request (TLS handshake, headers, form), then it
# is cut; and when every slot is taken, a new one cuts the oldest still sending. Idle
# connections, which need no credentials to open, so never keep a reader out.
REQUEST_DEADLINE_S = 5.0
SLOT_WAIT_S = 1.0  # for a cut connection's thread to give its slot back
MAX_FORM_BYTES = 4096
REQUEST_TIMEOUT_S = 15.0
RECENT_INCIDENTS = 50
_HEADERS = {
    "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer", "Cache-Control": "no-store", "X-Frame-Options": "DENY",
}


class WebSource(Protocol):
    """What the pages show: the coordinator's status and its stored incidents."""

    def status(self, query: StatusQuery = EVERY_JOB) -> Status: ...

    def incident(self, incident_id: str) -> Incident | None: ...

    def incidents(self, limit: int) -> list[tuple[Incident, str]]:
        """The newest incidents, each with the coordinator that stored it."""


class PageError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily, source: WebSource,
                 auth: WebAuth, tls: ssl.SSLContext | None) -> None:
        self.address_family = family
        super().__init__(address, _Handler)
        self.source, self.auth, self.tls = source, auth, tls
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._sending: dict[Any, float] = {}  # connection -> its deadline, until it has sent
        self._lock = threading.Lock()
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True,
                                          do_handshake_on_connect=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._cut(self._oldest_sending())
            if not self._slots.acquire(timeout=SLOT_WAIT_S):
                self.shutdown_request(request)
                return
        with self._lock:
            self._sending[request] = time.monotonic() + REQUEST_DEADLINE_S
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.request_sent(request)
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.request_sent(request)
            self._slots.release()

    def request_sent(self, request: Any) -> None:
        """`request`'s connection has sent all it will: it is served, no longer cut."""
        with self._lock:
            self._sending.pop(request, None)

    def service_actions(self) -> None:
        """Cuts the connections past their deadline (serve_forever calls this every poll)."""
        now = time.monotonic()
        with self._lock:
            late = [request for request, deadline in self._sending.items() if deadline <= now]
        for request in late:
            self._cut(request)

    def _oldest_sending(self) -> Any:
        with self._lock:
            return min(self._sending, key=self._sending.__getitem__, default=None)

    def _cut(self, request: Any) -> None:
        """Ends a connection still sending its request: the read its thread waits in returns,
        and the thread gives its slot back."""
        with self._lock:
            if self._sending.pop(request, None) is None:
                return
        with contextlib.suppress(OSError):  # the plain socket's: no TLS close to wait for
            socket.socket.shutdown(request, socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("web view: request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    server_version = "torch-hang-watchdog"
    sys_version = ""

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(self.timeout)
            self.request.do_handshake()
        super().setup()

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("web view %s: " + format, self.address_string(), *args)

    def _answer(self, page: Callable[[str], tuple[int, str, dict[str, str]]]) -> None:
        path = unquote(urlsplit(self.path).path)
        try:
            if not self.server.auth.host_allowed(self.headers.get("Host")):
                raise PageError(403, "this view answers only requests addressed to the "
                                     "address it listens on")
            refusal = self.server.auth.peer_refusal(self.client_address,
                                                    self.server.server_address[1])
            if refusal:
                log.warning("web view: refused %s: %s", self.address_string(), refusal)
                raise PageError(403, refusal)
            code, body, headers = page(path)
        except PageError as e:
            code, body, headers = e.code, error_page(e.code, str(e)), {}
        except Exception:
            log.exception("web view: %s %s failed", self.command, self.path)
            code, body, headers = 500, error_page(500, "the page failed; see the coordinator's "
                                                       "log"), {}
        data = body.encode()
        self.send_response(code)
        for name, value in {**_HEADERS, "Content-Type": "text/html; charset=utf-8",
                            "Content-Length": str(len(data)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _get(self, path: str) -> tuple[int, str, dict[str, str]]:
        self.server.request_sent(self.request)
        auth = self.server.auth
        if path == "/login":
            return 200, login_page(self._next(), failed=False), {}
        if not auth.allows(self.headers.get("Authorization"), self.headers.get("Cookie")):
            return 401, login_page(self.path if self.path.startswith("/") else "/", False), {}
        source = self.server.source
        if path == "/":
            return 200, jobs_page(_status(source), source.incidents(RECENT_INCIDENTS)), {}
        if path.startswith("/jobs/"):
            job_id = path.removeprefix("/jobs/")
            asked = parse_qs(urlsplit(self.path).query).get("ranks", [""])[0].strip()
            query = StatusQuery(job_id, _asked_ranks(asked))
            job = next((j for j in _status(source, query).get("jobs", ())
                        if j.get("job_id") == job_id), None)
            if job is None:
                raise PageError(404, f"no job {job_id!r} reports to this coordinator")
            return 200, job_page(job, asked), {}
        if path.startswith("/incidents/"):
            incident = source.incident(path.removeprefix("/incidents/"))
            if incident is None:
                raise PageError(404, "no such incident in this coordinator's database")
            return 200, incident_html(incident, nav=nav("incident")), {}
        raise PageError(404, "no such page")

    def _post(self, path: str) -> tuple[int, str, dict[str, str]]:
        if path != "/login":
            raise PageError(405, "this view is read-only")
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_FORM_BYTES:
            raise PageError(413, "form too large")
        form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
        self.server.request_sent(self.request)
        target = local_path(form.get("next", ["/"])[0])
        auth = self.server.auth
        if not auth.required:
            return 303, "", {"Location": target}
        cookie = auth.sign_in(form.get("token", [""])[0], secure=self.server.tls is not None)
        if cookie is None:
            log.warning("web view: wrong token from %s", self.address_string())
            return 401, login_page(target, failed=True), {}
        return 303, "", {"Location": target, "Set-Cookie": cookie}

    def _next(self) -> str:
        return local_path(parse_qs(urlsplit(self.path).query).get("next", ["/"])[0])


def _asked_ranks(spec: str) -> tuple[int, ...]:
    """The ranks a job page was asked to list in full (?ranks=90000-90100,5)."""
    try:
        return parse_ranks(spec, MAX_FULL_ROWS) if spec else ()
    except ValueError as e:
        raise PageError(400, f"ranks={spec[:80]}: {e}") from None


def _status(source: WebSource, query: StatusQuery = EVERY_JOB) -> Status:
    try:
        return source.status(query)
    except TimeoutError:
        raise PageError(503, "the coordinator did not answer in time; try again") from None


def local_path(target: str) -> str:
    """Only a path on this site, as a header may carry it: never '//elsewhere' or a scheme,
    which would redirect away, nor a line break, which would end the header."""
    printable = all(" " < c < "\x7f" for c in target)
    return target if printable and target.startswith("/") and not target.startswith(
        ("//", "/\\")) else "/"


class WebView:
    """The view's HTTP server, serving from its own threads until `stop`."""

    def __init__(self, listen: str, source: WebSource, auth: WebAuth,
                 tls: ssl.SSLContext | None = None) -> None:
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--web-listen {listen}: expected HOST:PORT, e.g. 127.0.0.1:8080")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._server = _Server((host.strip("[]"), int(port)), family, source, auth, tls)
        except OSError as e:
            raise UsageError(f"the web view cannot listen on {listen}: {e.strerror}",
                             hint="is another program using that port?") from e
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="web-view",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which must be running
            self._server.shutdown()
        self._server.server_close()


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """HTTPS with the coordinator's own certificate, when it has one."""
    if cert is None or key is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"the web view cannot use {cert} and {key}: {e}") from e
    return context
