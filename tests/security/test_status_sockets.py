"""Root's `watchdog status`, with no --coordinator, asks every user's `watchdog run` socket
(issue 37, finding 5). Another user's socket may answer anything: it must neither hide a job
of someone else's nor stop status from showing the others."""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from tests.helpers.attack import AS_NOBODY, WATCHDOG, clean_env
from tests.helpers.everyone import attacker, python

# `mail` (uid 8) stands for alice: her runs directory sorts after nobody's (65534), so root's
# status asks nobody's sockets first.
AS_ALICE = ["setpriv", "--reuid=mail", "--regid=mail", "--clear-groups"]
NOBODY_PREFIX = "forged-"


def row(pid: int, state: str) -> dict[str, Any]:
    return {"rank": 0, "host": socket.gethostname(), "node": "node-a", "pid": pid,
            "state": state, "step": 7, "last_collective": None, "setup": None, "stack": [],
            "children": [], "nccl_log": [], "nccl_findings": [], "worker_log": [],
            "worker_findings": [], "exit_code": None, "exit_reason": None, "heartbeat_age": 0.1,
            "phase": "", "activity": None, "timeline": None}


def job(job_id: str, state: str, pid: int) -> dict[str, Any]:
    return {"job_id": job_id, "attempt": 0, "state": state, "world_size": 1,
            "nodes": ["node-a"], "ranks": [row(pid, "WAITING" if state == "HUNG" else "RUNNING")],
            "rank_groups": [], "verdict": None, "findings": [], "flagged": []}


@contextmanager
def fake_run(as_user: list[str], answer: dict[str, Any]) -> Iterator[str]:
    proc = subprocess.Popen([*as_user, python(), attacker("fake_run.py"), json.dumps(answer)],
                            stdout=subprocess.PIPE, text=True, env=clean_env(), cwd="/")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], f"the fake run did not start: {line!r}"
        yield line[1]
    finally:
        proc.kill()
        proc.wait()


def root_status(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WATCHDOG, "status", *flags], capture_output=True, text=True,
                          timeout=60, env=clean_env(), cwd="/")


def test_another_users_socket_neither_hides_a_job_nor_stops_status() -> None:
    job_id = f"alice-{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        rank = stack.enter_context(_sleeping(AS_ALICE))  # alice's rank: her process
        stack.enter_context(fake_run(AS_NOBODY, {"jobs": [job(job_id, "RUNNING", rank.pid)]}))
        stack.enter_context(fake_run(AS_NOBODY, {"jobs": [{"job_id": f"{NOBODY_PREFIX}x"}]}))
        stack.enter_context(fake_run(AS_NOBODY, {"jobs": "not a list"}))
        stack.enter_context(fake_run(AS_ALICE, {"jobs": [job(job_id, "HUNG", rank.pid)]}))
        listed = root_status("--json")
        human = root_status()
    assert listed.returncode == 0, listed.stderr
    states = [j["state"] for j in json.loads(listed.stdout)["jobs"] if j["job_id"] == job_id]
    assert states == ["HUNG"], listed.stdout
    assert "its ranks are not the processes of user nobody" in listed.stderr, listed.stderr
    assert "not status JSON" in listed.stderr, listed.stderr
    assert human.returncode == 0, human.stderr
    assert "Traceback" not in human.stderr, human.stderr
    assert job_id in human.stdout and "HUNG" in human.stdout, human.stdout


@contextmanager
def _sleeping(as_user: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([*as_user, "sleep", "120"], cwd="/")
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
