"""Attack 5, an untrusted coordinator: a user's job names a MASTER_ADDR where the user listens;
a root agent never connects there (with a token or without). And a coordinator the agent does
talk to cannot keep a job paused: stack requests beyond one a second per job are refused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.attack import (
    AS_NOBODY,
    agent,
    clean_env,
    scratch_dir,
    shared_base,
    wait_for,
    worker,
)
from tests.helpers.everyone import attacker, python

LISTENER = """
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.77", 29450))
server.listen()
server.settimeout(0.2)
print("listening", flush=True)
while True:
    try:
        conn, _ = server.accept()
    except TimeoutError:
        continue
    print("connected", conn.recv(4096), flush=True)
"""


# The lure listens where the agent's default port meets the job's MASTER_ADDR: one address, so
# the two cases take turns on one worker.
@pytest.mark.xdist_group("lure_on_127.0.0.77:29450")
@pytest.mark.parametrize("token", [False, True])
def test_a_root_agent_never_follows_a_users_master_addr(token: bool) -> None:
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
        flags: list[str] = []
        if token:
            token_file = scratch / "token"
            token_file.write_text("3f1c9e0b7a5d4c2e8f6a1b0c9d8e7f6a\n")
            token_file.chmod(0o600)
            flags = ["--token-file", str(token_file)]
        listener = subprocess.Popen([*AS_NOBODY, python(), "-c", LISTENER],
                                    stdout=subprocess.PIPE, text=True, cwd="/")
        try:
            assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
            with worker({"beacon_dir": str(beacons), "job": "lure", "rank": 0, "world": 1},
                        AS_NOBODY, env=clean_env(MASTER_ADDR="127.0.0.77")), \
                    agent(scratch, beacons, *flags) as node:
                wait_for(lambda: "tracking rank 0 of job lure" in node.output(),
                         "the agent to find the job")
                # A session that began once the job was known would have followed it: two
                # session ends logged after the job was found, the second such session did.
                wait_for(lambda: node.output().partition("tracking rank 0 of job lure")[2]
                         .count("; retrying in ") >= 2, "a session after the job was found")
                log = node.output()
        finally:
            listener.kill()
            out = listener.communicate()[0]
    assert "connected" not in out
    assert "never follows a job's MASTER_ADDR: using 127.0.0.1:29450" in log
    assert "127.0.0.77" not in log


def test_a_coordinator_cannot_keep_a_job_paused_with_stack_requests(tmp_path: Path) -> None:
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
        flood = subprocess.Popen(
            [*AS_NOBODY, python(), attacker("flooding_coordinator.py"), "paused",
             "40"],
            stdout=subprocess.PIPE, text=True, env=clean_env(), cwd="/")
        try:
            assert flood.stdout is not None
            address = flood.stdout.readline().split()[-1]
            os.set_blocking(flood.stdout.fileno(), False)
            with worker({"beacon_dir": str(beacons), "job": "paused", "rank": 0, "world": 1},
                        AS_NOBODY), \
                    agent(scratch, beacons, "--coordinator", address) as node:
                line = wait_for(flood.stdout.readline, "the flood's outcome")
                result = json.loads(line)
                assert node.alive
        finally:
            flood.kill()
            flood.wait()
    assert result["answers"] == 40
    assert 1 <= result["dumped"] <= 2 + result["seconds"]  # at most one a second, and a spare
    assert result["refused"] == 40 - result["dumped"]
