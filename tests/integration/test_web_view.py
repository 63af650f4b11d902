"""The coordinator's read-only web view (`--web-listen`) in real headless Chromium: a real job
under a real agent, hostile names that reach it through real gRPC and through the incident
database, and who may read it (token, login form, cookie, TLS, loopback)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.helpers.browser import screenshot
from tests.helpers.builders import SITE
from tests.helpers.daemons import (
    JOB_ID,
    WebDaemons,
    end_job,
    running,
    start_job,
    wait_for_verdict,
)
from tests.helpers.harness import WATCHDOG, job_env, wait_for_output
from watchdog.cli.demo import free_port
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.model import (
    Frame,
    GroupProgress,
    NodeReport,
    RankStack,
    RankState,
    StackReply,
    StackRequest,
)
from watchdog.transport import CoordinatorClient

TOKEN = "9d2f0c4b6a8e1f3d5c7b9a0e2d4f6a8c"
# Worker-supplied names that would run script if any page let them through as markup; the
# browser tests load pages with the CSP bypassed, so only the escaping stands in the way.
EVIL_FUNCTION = "<script>window.__pwned = 1</script>"
EVIL_FILE = "/home/ml/<img src=x onerror=\"window.__pwned = 2\">.py"
EVIL_JOB = "job-<b>bold</b>&co"
EVIL_HOST = "<i>node</i>"
EVIL_LOG = "NCCL WARN <script>window.__pwned = 3</script> Connection closed by remote peer"


@dataclass
class Web:
    proc: subprocess.Popen[bytes]
    grpc: str
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@contextmanager
def web_coordinator(tmp: Path, *flags: str, web_host: str = "127.0.0.1") -> Iterator[Web]:
    grpc_address, web_address = f"127.0.0.1:{free_port()}", f"{web_host}:{free_port()}"
    log = tmp / f"coordinator-{web_address.rsplit(':')[1]}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*WATCHDOG, "coordinator", "--listen", grpc_address, "--db",
                                 str(tmp / "incidents.db"), "--web-listen", web_address, *flags],
                                stdout=out, stderr=subprocess.STDOUT)
    scheme = "https" if "--tls-cert" in flags else "http"
    web = Web(proc, grpc_address, f"{scheme}://{web_address}", log)
    try:
        wait_for_output(proc, web.output, "web view on")
        yield web
    finally:
        proc.terminate()
        proc.wait(15)


# -- a real job ------------------------------------------------------------------------------

def test_web_view_shows_a_running_job_and_its_verdict(tmp_path: Path, browser: Any) -> None:
    with running(WebDaemons, tmp_path) as daemons:
        _a_running_job_and_its_verdict(daemons, tmp_path, browser)


def _a_running_job_and_its_verdict(daemons: WebDaemons, tmp_path: Path, browser: Any) -> None:
    job = start_job(tmp_path, *WATCHDOG, "launch", "--")
    try:
        wait_for_verdict(daemons.address)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"http://{daemons.web}/")
        row = page.locator(f'tr.job[data-job="{JOB_ID}"]')
        assert "HUNG" in row.inner_text()
        assert "MISSING_RANKS: rank 2 (stuck in read_sample_from_storage" in row.inner_text()
        screenshot(page, tmp_path, "web-jobs.png")

        row.locator("a").click()
        assert page.url.endswith(f"/jobs/{JOB_ID}")
        cells = page.locator(".grid .cell")
        assert cells.count() == 4
        assert page.locator(".grid .cell.culprit").get_attribute("data-rank") == "2"
        assert page.locator('.cell[data-rank="0"]').get_attribute("data-state") == "WAITING"
        sentence = page.locator(".verdict .sentence").inner_text()
        assert sentence.startswith("rank 2 (stuck in read_sample_from_storage at train.py:")
        screenshot(page, tmp_path, "web-job.png")

        page.get_by_text("the whole incident").click()
        assert page.locator("h1").inner_text().startswith("MISSING_RANKS")
        assert page.locator(".tree .split > .branch").first.get_attribute("data-ranks") == \
            "rank 2"
        page.close()
    finally:
        end_job(job)


# -- hostile names through real gRPC ---------------------------------------------------------

def rank_state(rank: int, now: float) -> RankState:
    waiting = rank != 2  # rank 2 never enters all_reduce #8; the others wait in it
    group = GroupProgress("0", (0, 1, 2, 3), 8 if waiting else 7, "all_reduce", 7, now - 30)
    return RankState(job_id=EVIL_JOB, rank=rank, local_rank=rank, world_size=4, host=EVIL_HOST,
                     pid=50_000 + rank, hooked=True, proc_state="S", heartbeat_age=0.1, steps=7,
                     events=40, last_event_at=now - 30, groups=(group,))


def stack(rank: int) -> RankStack:
    if rank == 2:
        return RankStack(2, 50_002, (Frame(EVIL_FUNCTION, EVIL_FILE, 42),
                                     Frame("main", "/home/ml/train.py", 10)),
                         nccl_log=(EVIL_LOG,))
    return RankStack(rank, 50_000 + rank, (
        Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 829),
        Frame("backward", f"{SITE}/torch/_tensor.py", 648),
        Frame("main", "/home/ml/train.py", 12)))


class FakeAgent:
    """An agent on real gRPC that reports a hung 4-rank job and answers stack requests with
    the names above; it runs in a thread of its own until `stop`."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> FakeAgent:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    async def _run(self) -> None:
        replies: asyncio.Queue[StackReply] = asyncio.Queue()

        async def outgoing() -> AsyncIterator[NodeReport | StackReply]:
            while not self._stop.is_set():
                now = time.time()
                yield NodeReport("node-evil", now, tuple(rank_state(r, now) for r in range(4)))
                while not replies.empty():
                    yield replies.get_nowait()
                await asyncio.sleep(0.25)

        client = CoordinatorClient(self.address)
        try:
            async for request in client.connect(outgoing()):
                assert isinstance(request, StackRequest)
                replies.put_nowait(StackReply(request.request_id, "node-evil",
                                              tuple(stack(r) for r in request.ranks)))
        finally:
            await client.close()


def wait_for_evil_verdict(address: str) -> dict[str, Any]:
    """Through `watchdog status` (Playwright's own event loop owns this thread)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run([*WATCHDOG, "status", "--json", "--coordinator", address],
                             capture_output=True, text=True, timeout=30)
        jobs = [j for j in json.loads(out.stdout or '{"jobs": []}')["jobs"]
                if j["job_id"] == EVIL_JOB]
        if jobs and jobs[0]["verdict"]:
            return dict(jobs[0]["verdict"])
        time.sleep(0.5)
    raise AssertionError("no verdict for the fake agent's job")


def assert_inert(page: Any) -> None:
    """No markup from a worker became an element, and none of it ran."""
    assert page.evaluate("() => document.querySelectorAll('script, img').length") == 0
    assert page.evaluate("() => [...document.querySelectorAll('b, i')].every("
                         "e => !['bold', 'node'].includes(e.textContent))")
    assert page.evaluate("() => window.__pwned === undefined")


def test_worker_supplied_names_are_text_in_the_web_view(tmp_path: Path, browser: Any) -> None:
    with web_coordinator(tmp_path, "--stall-timeout", "1") as web, FakeAgent(web.grpc):
        verdict = wait_for_evil_verdict(web.grpc)
        assert verdict["culprit_ranks"] == [2], verdict
        page = browser.new_page(bypass_csp=True)  # only the escaping stands in the way
        page.goto(f"{web.url}/")
        assert page.locator("tr.job a").inner_text() == EVIL_JOB
        assert_inert(page)
        page.locator("tr.job a").click()
        assert page.url.endswith("/jobs/" + quote(EVIL_JOB, safe=""))
        assert EVIL_HOST in page.locator(".grid .cell").first.get_attribute("title")
        assert EVIL_FUNCTION in page.locator(".verdict .sentence").inner_text()
        assert_inert(page)
        page.get_by_text("the whole incident").click()
        assert EVIL_FUNCTION in page.locator(".tree .branch.culprit .leaf").inner_text()
        assert EVIL_LOG in page.locator("pre").first.inner_text()
        assert EVIL_FILE in page.locator("body").inner_text()
        assert_inert(page)
        screenshot(page, tmp_path, "web-hostile-names.png")
        page.close()


def test_worker_supplied_names_are_text_in_the_html_report(tmp_path: Path,
                                                           browser: Any) -> None:
    """A stored incident written with hostile names (as a coordinator would store them) through
    `watchdog incidents show --html`."""
    row = {"rank": 2, "host": EVIL_HOST, "pid": 4242, "state": EVIL_FUNCTION, "step": 7,
           "last_collective": {"group": EVIL_FUNCTION, "seq": 7, "op": EVIL_FUNCTION,
                               "completed": True},
           "stack": [{"function": EVIL_FUNCTION, "file": EVIL_FILE, "line": 42}],
           "nccl_log": [EVIL_LOG], "worker_log": [EVIL_LOG],
           "nccl_findings": [{"category": EVIL_FUNCTION, "cause": EVIL_LOG, "fix": EVIL_LOG,
                              "text": EVIL_LOG, "line_no": 1, "ranks": [2]}],
           "exit_reason": {"exception": {"type": EVIL_FUNCTION, "message": EVIL_LOG}},
           "activity": {EVIL_FUNCTION: EVIL_LOG}, "phase": EVIL_FUNCTION,
           "timeline": {"last_event_at": 1.0e9, "exited_at": None, "collectives": [
               {"group": EVIL_FUNCTION, "seq": 7, "op": EVIL_FUNCTION, "completed": True,
                "entered_at": 1.0e9}]}}
    incident = {"id": "hostile0001", "job_id": EVIL_JOB, "detected_at": 1.0e9 + 5,
                "kind": EVIL_FUNCTION, "severity": EVIL_FUNCTION, "summary": EVIL_LOG,
                "culprit_ranks": [2], "waiting_ranks": [], "collective": None,
                "ranks": [row], "stack_groups": [], "node": EVIL_HOST}
    store = SqliteStore(str(tmp_path / "incidents.db"))
    store.add(incident)
    store.close()
    page_path = tmp_path / "hostile.html"
    out = subprocess.run([*WATCHDOG, "incidents", "show", "hostile0001", "--html",
                          str(page_path)], env=job_env(tmp_path), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    page = browser.new_page(bypass_csp=True)
    page.goto(page_path.as_uri())
    text = page.locator("body").inner_text()
    for name in (EVIL_FUNCTION, EVIL_FILE, EVIL_JOB, EVIL_HOST, EVIL_LOG):
        assert name in text
    assert_inert(page)
    page.close()


# -- who may read ----------------------------------------------------------------------------

def token_file(tmp: Path) -> str:
    path = tmp / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return str(path)


def get(url: str, headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None) -> tuple[int, str, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20, context=context) as answer:
            return answer.status, answer.read().decode(), answer.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def post_login(url: str, token: str) -> tuple[int, Any]:
    data = f"token={quote(token)}&next=%2F".encode()
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(f"{url}/login", data=data), timeout=20) as answer:
            return answer.status, answer.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def test_with_a_token_readers_sign_in(tmp_path: Path, browser: Any) -> None:
    with web_coordinator(tmp_path, "--token-file", token_file(tmp_path)) as web:
        code, body, _ = get(f"{web.url}/")
        assert code == 401 and 'name="token"' in body
        assert get(f"{web.url}/", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert get(f"{web.url}/", {"Authorization": "Bearer wrong"})[0] == 401
        assert post_login(web.url, "wrong")[0] == 401
        code, headers = post_login(web.url, TOKEN)
        assert code == 303 and headers["Location"] == "/"
        cookie = headers["Set-Cookie"]
        assert TOKEN not in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        session = cookie.split(";")[0]
        assert get(f"{web.url}/", {"Cookie": session})[0] == 200
        assert get(f"{web.url}/", {"Cookie": session + "0"})[0] == 401

        page = browser.new_page()  # the same, as a person does it
        page.goto(f"{web.url}/")
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        assert page.locator("h1").inner_text() == "Jobs"
        page.close()
        assert TOKEN not in web.output()


def test_without_a_token_loopback_only_and_loopback_names_only(tmp_path: Path) -> None:
    refused = subprocess.run([*WATCHDOG, "coordinator", "--listen", f"127.0.0.1:{free_port()}",
                              "--db", str(tmp_path / "i.db"), "--web-listen",
                              f"0.0.0.0:{free_port()}"], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2
    assert "--token-file" in refused.stderr
    with web_coordinator(tmp_path) as web:
        code, _, headers = get(f"{web.url}/")
        assert code == 200
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        # A page elsewhere that rebinds its own name to 127.0.0.1 sends its own Host.
        assert get(f"{web.url}/", {"Host": "attacker.example"})[0] == 403


def self_signed(tmp: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coordinator")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    os.chmod(tmp / "key.pem", 0o600)
    return str(tmp / "cert.pem"), str(tmp / "key.pem")


def test_with_the_coordinators_certificate_the_view_speaks_https(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with web_coordinator(tmp_path, "--token-file", token_file(tmp_path), "--tls-cert", cert,
                         "--tls-key", key) as web:
        trusted = ssl.create_default_context(cafile=cert)
        assert get(f"{web.url}/", {"Authorization": f"Bearer {TOKEN}"}, trusted)[0] == 200
        with pytest.raises(OSError):  # plain HTTP gets no answer
            get(web.url.replace("https:", "http:") + "/")
        assert "Secure" in post_login_https(web.url, trusted)


def post_login_https(url: str, context: ssl.SSLContext) -> str:
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(f"{url}/login", data=f"token={TOKEN}".encode())
    try:
        opener.open(request, timeout=20)
    except urllib.error.HTTPError as e:
        return str(e.headers["Set-Cookie"])
    raise AssertionError("no redirect after signing in")
