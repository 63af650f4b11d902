"""Incident webhooks against a real local HTTP receiver: what is posted, retries, what is never
followed or posted, and that a receiver which hangs holds up nothing but its own thread."""

from __future__ import annotations

import subprocess

import pytest
from _harness import WATCHDOG
from _receiver import HANG, receiving

from watchdog import metrics
from watchdog.cli.demo import free_port
from watchdog.coordinator.webhook import Webhooks, check_url
from watchdog.errors import UsageError

INCIDENT = {"id": "a1b2c3", "job_id": "train-1", "detected_at": 1764680000.12,
            "kind": "MISSING_RANKS", "severity": "hang", "summary": "rank 1 never reached ...",
            "culprit_ranks": [1], "waiting_ranks": [0, 2, 3]}
FAST = {"timeout": 2.0, "backoff": 0.05}


def delivered(outcome: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "torch_hang_watchdog_webhook_deliveries_total", {"outcome": outcome})
    return value or 0.0


def test_a_hang_is_posted_as_its_incident_json() -> None:
    with receiving(200) as receiver:
        hooks = Webhooks([receiver.url], **FAST)
        hooks({**INCIDENT, "severity": "notice", "id": "notice"})  # not a hang: not posted
        hooks({**INCIDENT, "severity": "warning", "id": "warning"})
        hooks(INCIDENT)
        hooks.close()
    (post,) = receiver.posts
    assert post.json() == INCIDENT
    assert post.path == "/hook/SECRET"
    assert post.headers["Content-Type"] == "application/json"
    assert post.headers["User-Agent"].startswith("torch-hang-watchdog/")


def test_an_incident_without_severity_is_a_hang() -> None:
    legacy = {k: v for k, v in INCIDENT.items() if k != "severity"}
    with receiving(200) as receiver:
        hooks = Webhooks([receiver.url], **FAST)
        hooks(legacy)
        hooks.close()
    assert [p.json() for p in receiver.posts] == [legacy]


def test_server_errors_are_retried_until_the_receiver_takes_it() -> None:
    sent = delivered("sent")
    with receiving(503, 500, 200) as receiver:
        hooks = Webhooks([receiver.url], attempts=3, **FAST)
        hooks(INCIDENT)
        hooks.close()
    assert [p.json()["id"] for p in receiver.posts] == ["a1b2c3"] * 3
    assert delivered("sent") == sent + 1


@pytest.mark.parametrize("status", [400, 302])
def test_client_errors_and_redirects_are_not_retried_or_followed(status: int) -> None:
    failed = delivered("failed")
    with receiving(status, 200) as receiver:
        hooks = Webhooks([receiver.url], attempts=3, **FAST)
        hooks(INCIDENT)
        hooks.close()
    assert [p.path for p in receiver.posts] == ["/hook/SECRET"]  # never /elsewhere
    assert delivered("failed") == failed + 1


def test_a_hanging_receiver_holds_up_neither_the_caller_nor_other_receivers(
        caplog: pytest.LogCaptureFixture) -> None:
    with receiving(HANG) as stuck, receiving(200) as fine:
        hooks = Webhooks([stuck.url, fine.url], attempts=1, timeout=30.0, backoff=0.05)
        hooks(INCIDENT)  # returns at once: the posts are queued
        assert stuck.arrived.wait(30)
        assert [p.json() for p in fine.wait_for(1)] == [INCIDENT]
        assert not stuck.release.is_set()  # the stuck receiver still has not answered
        stuck.release.set()
        hooks.close()
    assert "SECRET" not in caplog.text  # a webhook URL's path is its secret: never logged


def test_a_refused_connection_is_retried_then_given_up(caplog: pytest.LogCaptureFixture) -> None:
    failed = delivered("failed")
    hooks = Webhooks([f"http://127.0.0.1:{free_port()}/hook"], attempts=2, **FAST)
    hooks(INCIDENT)
    hooks.close()
    assert delivered("failed") == failed + 1
    assert "trying again (attempt 2)" in caplog.text
    assert "giving up" in caplog.text


def test_a_full_queue_drops_instead_of_blocking() -> None:
    dropped = delivered("dropped")
    with receiving(HANG) as stuck:
        hooks = Webhooks([stuck.url], attempts=1, timeout=30.0, queue_size=1)
        hooks(INCIDENT)
        assert stuck.arrived.wait(30)  # one in flight
        hooks(INCIDENT)  # one queued
        hooks(INCIDENT)  # no room
        assert delivered("dropped") == dropped + 1
        stuck.release.set()
        hooks.close()


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://host/x", "http://", "hooks"])
def test_only_http_urls_are_accepted(url: str) -> None:
    with pytest.raises(UsageError, match="needs an http:// or https:// URL"):
        check_url(url)


def test_a_bad_webhook_url_is_a_usage_error_before_the_coordinator_starts() -> None:
    out = subprocess.run([*WATCHDOG, "coordinator", "--notify-webhook", "file:///etc/passwd"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "argument --notify-webhook: --notify-webhook needs an http" in out.stderr
