"""`watchdog check`'s preflight: where the ranks meet, and the settings that stop it before the
job (sockets on this host, no subprocess), and its report of the job's steps."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest

from watchdog.cli.check import report
from watchdog.cli.rendezvous import (
    FAIL,
    OK,
    WARN,
    Rendezvous,
    environment_checks,
    rendezvous_checks,
    rendezvous_of,
)


@pytest.mark.parametrize(("args", "env", "expected"), [
    ([], {}, Rendezvous("127.0.0.1", 29500, "29500", 1, 0, False)),
    ([], {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "23456"},
     Rendezvous("10.0.0.9", 23456, "23456", 1, 0, False)),
    (["--master_addr", "node0", "--master-port=1234", "--nnodes=2", "--node_rank", "1"],
     {"MASTER_PORT": "9"}, Rendezvous("node0", 1234, "1234", 2, 1, True)),
    (["--rdzv-endpoint=head:29400", "--nnodes=1:4"], {},
     Rendezvous("head", 29400, "29400", 4, 0, True)),
    ([], {"MASTER_PORT": "http"}, Rendezvous("127.0.0.1", None, "http", 1, 0, False)),
])
def test_where_the_ranks_meet(args: list[str], env: dict[str, str],
                              expected: Rendezvous) -> None:
    assert rendezvous_of(args, env) == expected


@pytest.mark.parametrize(("env", "level", "category"), [
    ({}, OK, ""),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, WARN, ""),
    ({"RANK": "2", "WORLD_SIZE": "2"}, FAIL, "INVALID_RANK"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, FAIL, "INVALID_RANK"),
    ({"RANK": "0"}, FAIL, "ENV_MISSING"),
])
def test_rank_variables_of_this_shell(env: dict[str, str], level: str, category: str) -> None:
    (check,) = environment_checks(env)
    assert (check.level, check.category) == (level, category), check.message


def test_a_free_port_of_this_host_passes_and_a_taken_one_fails() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    here = Rendezvous("127.0.0.1", port, str(port), 1, 0, False)
    assert [c.level for c in rendezvous_checks(here)] == [OK, OK]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        address, in_use = rendezvous_checks(here)
    assert address.level == OK
    assert (in_use.level, in_use.category) == (FAIL, "PORT_IN_USE")


@pytest.mark.parametrize(("addr", "nnodes", "node_rank", "level", "category"), [
    ("192.0.2.1", 1, 0, FAIL, "CONNECT_FAILED"),  # TEST-NET-1: never an address of this host
    ("no-such-host.invalid", 1, 0, FAIL, "CONNECT_FAILED"),
    ("127.0.0.1", 2, 1, WARN, "CONNECT_FAILED"),  # node 1: the store is node 0's, not up yet
])
def test_a_master_that_this_node_cannot_host_or_reach(addr: str, nnodes: int, node_rank: int,
                                                       level: str, category: str) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    (check,) = rendezvous_checks(Rendezvous(addr, port, str(port), nnodes, node_rank, True))
    assert (check.level, check.category) == (level, category), check.message


def test_the_report_passes_only_when_every_rank_did_every_step(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("")
    steps = {(rank, step): {"rank": rank, "step": step, "seconds": 0.01, "error": ""}
             for rank in (0, 1) for step in ("init_process_group", "all_reduce", "barrier",
                                             "destroy_process_group")}
    out = io.StringIO()
    assert report(0, 2, steps, [], str(log), out) == 0
    assert "all_reduce              2/2       0.010 s" in out.getvalue()
    steps[(1, "all_reduce")] = {**steps[(1, "all_reduce")], "error": "RuntimeError: boom"}
    log.write_text("[E1202 ProcessGroupGloo.cpp:144] Gloo connectFullMesh failed with ... "
                   "Connection refused\n")
    out = io.StringIO()
    assert report(1, 2, steps, [], str(log), out) == 1
    assert "  rank 1: RuntimeError: boom" in out.getvalue()
    assert "CONNECT_FAILED" in out.getvalue()  # what explain makes of the job's output
