"""Incident webhooks (coordinator process): `--notify-webhook URL` POSTs the JSON of every hang
incident (the object `incidents show --json` prints) to URL.

The coordinator only queues a post, after the incident is stored: each URL has a thread and a
bounded queue of its own, so a receiver that hangs or refuses delays neither detection, nor
storage, nor the other receivers. A post is tried ATTEMPTS times, TIMEOUT_S each as a whole
(connecting, sending and the whole answer: `coordinator.deadline`), with growing pauses between;
redirects are not followed (a POST redirected by urllib becomes a GET without its body). Nothing
here runs anything: it only posts. URLs are logged by scheme and host alone, since a webhook
URL often carries its secret in the path (Slack's do). A queue is shared by every user's jobs,
so one user's burst of hangs takes at most OWNER_SHARE of it: their later posts are dropped,
never another user's (the store keeps every incident either way).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from watchdog import __version__, metrics
from watchdog.coordinator.deadline import Deadline
from watchdog.errors import UsageError
from watchdog.schema import Incident, is_hang

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
ATTEMPTS = 3
BACKOFF_S = 1.0
QUEUE_SIZE = 64
OWNER_SHARE = QUEUE_SIZE // 4  # posts one owner (the uid most of a job's ranks run as) may queue
_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def check_url(url: str) -> str:
    """`url` when it is an http(s) URL with a host; UsageError otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--notify-webhook needs an http:// or https:// URL, not {url!r}")
    return url


def redacted(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/..."


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises HTTPError with the 3xx status


class Webhook:
    """Posts to one URL from a thread of its own."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S, attempts: int = ATTEMPTS,
                 backoff: float = BACKOFF_S, queue_size: int = QUEUE_SIZE,
                 owner_share: int = OWNER_SHARE) -> None:
        self.url = check_url(url)
        self.timeout, self.attempts, self.backoff = timeout, attempts, backoff
        self._queue: queue.Queue[tuple[bytes, str] | None] = queue.Queue(queue_size)
        self._owner_share = owner_share
        self._queued: Counter[str] = Counter()  # posts queued or being posted, by owner
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"webhook {redacted(url)}",
                                        daemon=True)
        self._thread.start()

    def offer(self, body: bytes, owner: str = "") -> None:
        """Queue a post of `owner`'s incident without waiting; a full queue, or an owner's
        full share of it, drops it, with a log line."""
        with self._lock:
            if self._queued[owner] >= self._owner_share:
                self._drop(f"{self._queued[owner]} posts of uid {owner or 'unknown'} already "
                           "queued")
                return
            try:
                self._queue.put_nowait((body, owner))
            except queue.Full:
                self._drop(f"{self._queue.qsize()} posts already queued")
                return
            self._queued[owner] += 1

    def _drop(self, why: str) -> None:
        metrics.WEBHOOK_DELIVERIES.labels("dropped").inc()
        log.warning("webhook %s: %s; dropping an incident", redacted(self.url), why)

    def close(self, deadline: float) -> None:
        """Post what is queued until the monotonic `deadline`, then stop retrying."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._closing.set()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            body, owner = item
            try:
                outcome = "sent" if self._deliver(body) else "failed"
            except Exception:  # a thread that must not die: log and go on
                log.exception("webhook %s failed", redacted(self.url))
                outcome = "failed"
            with self._lock:
                self._queued[owner] -= 1
                if not self._queued[owner]:
                    del self._queued[owner]
            metrics.WEBHOOK_DELIVERIES.labels(outcome).inc()

    def _deliver(self, body: bytes) -> bool:
        for attempt in range(1, self.attempts + 1):
            error, retry = self._post(body)
            if error is None:
                return True
            last = attempt == self.attempts or not retry
            log.warning("webhook %s: %s%s", redacted(self.url), error,
                        "; giving up" if last else f"; trying again (attempt {attempt + 1})")
            if last or self._closing.wait(self.backoff * 2 ** (attempt - 1)):
                return False
        return False

    def _post(self, body: bytes) -> tuple[str | None, bool]:
        """(None, _) when the receiver took it; else (why not, whether to try again)."""
        request = urllib.request.Request(self.url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": f"torch-hang-watchdog/{__version__}"})
        deadline = Deadline(self.timeout)
        try:
            with deadline.opener(_NoRedirect()).open(request, timeout=self.timeout) as response:
                response.read(65536)
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code} {e.reason}", e.code in _RETRY_STATUS
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            if deadline.passed:  # cut short: whatever broke, it broke because time was up
                return f"no whole answer within {self.timeout:g} s", True
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            return f"{reason or type(e).__name__}", True  # refused, unreachable, timed out
        finally:
            deadline.close()
        return None, False


class Webhooks:
    """The coordinator's listener for `--notify-webhook` URLs."""

    def __init__(self, urls: Sequence[str], owner_of: Callable[[str], str] = lambda _: "",
                 **options: Any) -> None:
        """`owner_of(job_id)`: whose share of each queue the job's posts take."""
        self.hooks = [Webhook(url, **options) for url in urls]
        self._owner_of = owner_of

    def __call__(self, incident: Incident) -> None:
        if not is_hang(incident):  # notices and warnings are not posted
            return
        body, owner = json.dumps(incident).encode(), self._owner_of(incident["job_id"])
        for hook in self.hooks:
            hook.offer(body, owner)

    def close(self, grace: float = TIMEOUT_S) -> None:
        """Give queued posts `grace` seconds in all; the threads are daemons, so a receiver that
        never answers cannot hold the process past that."""
        deadline = time.monotonic() + grace
        for hook in self.hooks:
            hook.close(deadline)
