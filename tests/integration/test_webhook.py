"""Incident webhooks against a real local HTTP receiver: what is posted, retries, what is never
followed or posted, and that a receiver which hangs holds up nothing but its own thread; then a
real hang, found by separate daemons, posted to receivers that answer, hang and refuse."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.daemons import end_job, job_incidents, start_job, wait_for_verdict
from tests.helpers.harness import WATCHDOG, job_env, stop_process
from tests.helpers.receiver import HANG, receiving
from tests.helpers.scrape import scrape, value
from watchdog import metrics
from watchdog.cli.demo import free_port
from watchdog.coordinator.webhook import OWNER_SHARE, QUEUE_SIZE, Webhooks, check_url
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


def test_one_users_burst_of_hangs_takes_only_its_share_and_never_anothers_post() -> None:
    """A burst past the whole queue: before shares, the queue took 65 of the burst and dropped
    root's post behind them."""
    dropped, owner = delivered("dropped"), {INCIDENT["job_id"]: "0"}
    with receiving(HANG, 200) as receiver:
        hooks = Webhooks([receiver.url], owner_of=lambda job: owner.get(job, "65534"), attempts=1,
                         timeout=30.0)
        burst = [dict(INCIDENT, id=f"b{i}", job_id=f"burst-{i}") for i in range(QUEUE_SIZE + 6)]
        hooks(burst[0])
        assert receiver.arrived.wait(30)  # in flight, and counted in its owner's share
        for incident in burst[1:]:
            hooks(incident)
        hooks(INCIDENT)
        assert delivered("dropped") == dropped + len(burst) - OWNER_SHARE
        receiver.release.set()
        posts = receiver.wait_for(OWNER_SHARE + 1)
        hooks.close()
    assert [p.json()["job_id"] for p in posts] == [
        *(i["job_id"] for i in burst[:OWNER_SHARE]), INCIDENT["job_id"]]


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://host/x", "http://", "hooks"])
def test_only_http_urls_are_accepted(url: str) -> None:
    with pytest.raises(UsageError, match="needs an http:// or https:// URL"):
        check_url(url)


def test_a_bad_webhook_url_is_a_usage_error_before_the_coordinator_starts() -> None:
    out = subprocess.run([*WATCHDOG, "coordinator", "--notify-webhook", "file:///etc/passwd"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "argument --notify-webhook: --notify-webhook needs an http" in out.stderr


# -- a real hang, seen by separate daemons -------------------------------------------------------

def test_a_real_hang_reaches_the_webhook_and_a_stuck_receiver_delays_nothing(
        tmp_path: Path) -> None:
    address, metrics_ports = f"127.0.0.1:{free_port()}", (free_port(), free_port())
    env = job_env(tmp_path)
    refused = f"http://127.0.0.1:{free_port()}/refused"
    with receiving(HANG) as stuck, receiving(200) as fine:
        daemons = [subprocess.Popen(
            [*WATCHDOG, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) for args in (
                ["coordinator", "--listen", address, "--stall-timeout", "3",
                 "--notify-webhook", stuck.url, "--notify-webhook", refused,
                 "--notify-webhook", fine.url, "--metrics-listen",
                 f"127.0.0.1:{metrics_ports[0]}"],
                ["agent", "--coordinator", address, "--interval", "0.25", "--node-name",
                 "node-a", "--metrics-listen", f"127.0.0.1:{metrics_ports[1]}"])]
        job = start_job(tmp_path, *WATCHDOG, "launch", "--")
        try:
            verdict = wait_for_verdict(address)["verdict"]
            stored = job_incidents(tmp_path)
            # Detected and stored while the stuck receiver still holds its post unanswered.
            assert stuck.arrived.wait(60) and not stuck.release.is_set()
            (post,) = fine.wait_for(1)
            coordinator_metrics, agent_metrics = (scrape(port) for port in metrics_ports)
        finally:
            end_job(job)
            logs = [stop_process(proc) for proc in daemons]
    print("\n---\n".join(logs))
    assert post.json() == verdict == next(i for i in stored if i["id"] == verdict["id"])
    assert verdict["kind"] == "MISSING_RANKS" and verdict["culprit_ranks"] == [2]
    assert {p.json()["id"] for p in stuck.posts} == {verdict["id"]}  # tried, timed out, again
    assert value(coordinator_metrics, "torch_hang_watchdog_webhook_deliveries_total",
                 outcome="sent") == 1
    # one look with stacks at least (a slow step on a loaded machine may have had its own)
    assert (value(agent_metrics, "torch_hang_watchdog_stack_dump_seconds_count") or 0) >= 1
    assert value(agent_metrics, "torch_hang_watchdog_agent_ranks") == 4
    assert "webhook http://127.0.0.1:" in logs[0] and "Connection refused" in logs[0]
    assert "SECRET" not in logs[0]
