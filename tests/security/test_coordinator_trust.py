"""Attack 6, trusting the coordinator's callers: without a token it serves root and its own user
only; with tokens, each role's token calls only its role's methods; an agent cannot report for a
node another connected agent holds, nor answer the stack requests sent to another."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.attack import (
    AS_NOBODY,
    NOBODY,
    agent,
    coordinator,
    hung_job,
    job,
    rogue,
    scratch_dir,
    shared_base,
    status,
    token_file,
    verdict,
    wait_for,
    worker,
)


def test_without_a_token_other_users_can_neither_read_nor_report() -> None:
    with scratch_dir() as scratch, coordinator(scratch) as coord:
        with rogue(coord.address, "-", "node-x", "injected") as answer:
            assert answer.startswith("refused: PERMISSION_DENIED"), answer
        theirs = status(coord.address, as_user=AS_NOBODY)
        ours = status(coord.address)
        log = coord.output()
    assert theirs.returncode == 1
    assert "serves only root and uid 0 on its own machine, not uid 65534" in theirs.stderr
    assert ours.returncode == 0 and '"jobs": []' in ours.stdout
    assert f"not uid {NOBODY}" in log
    assert "listening on" in log and "without a token: only root and uid 0" in log


def test_each_token_calls_only_what_its_role_may(tmp_path: Path) -> None:
    with scratch_dir() as scratch:
        agent_token = token_file(scratch, "agent", NOBODY)
        reader_token = token_file(scratch, "reader", NOBODY)
        with coordinator(scratch, "--agent-token-file", agent_token,
                         "--reader-token-file", reader_token) as coord:
            read_with_agent = status(coord.address, "--token-file", agent_token,
                                     as_user=AS_NOBODY)
            read_with_reader = status(coord.address, "--token-file", reader_token,
                                      as_user=AS_NOBODY)
            with rogue(coord.address, reader_token, "node-x", "injected") as answer:
                pass
            injected = job(coord.address, "injected", "--token-file", reader_token)
    assert read_with_agent.returncode == 1
    assert "the agent token may not call Status: pass the control or reader token" in (
        read_with_agent.stderr)
    assert read_with_reader.returncode == 0, read_with_reader.stderr
    assert answer == ("refused: PERMISSION_DENIED the reader token may not call Connect: pass "
                      "the agent token")
    assert injected is None


def test_an_agent_cannot_speak_for_another_node_nor_answer_its_requests() -> None:
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
        agent_token = token_file(scratch, "agent")
        stolen = token_file(scratch, "stolen-agent", NOBODY)
        Path(stolen).write_text(Path(agent_token).read_text())  # a compromised node's copy
        reader = ("--token-file", token_file(scratch, "reader"))
        rank0, rank1 = hung_job(beacons, "victim")
        with coordinator(scratch, "--agent-token-file", agent_token, "--reader-token-file",
                         reader[1], "--stall-timeout", "2") as coord, \
                agent(scratch, beacons, "--coordinator", coord.address, "--token-file",
                      agent_token):
            with worker({**rank0, "job": "canary"}):  # node-a is bound to the real agent
                wait_for(lambda: job(coord.address, "canary", *reader), "the real agent")
            with rogue(coord.address, stolen, "node-a", "victim") as answer, \
                    worker(rank0) as real0, worker(rank1) as real1:
                assert answer == "connected"
                view = verdict(coord.address, "victim", *reader)
            log = coord.output()
    incident = view["verdict"]
    assert incident["kind"] == "MISSING_RANKS" and incident["culprit_ranks"] == [1]
    assert [row["pid"] for row in incident["ranks"]] == [real0.pid, real1.pid]
    assert "EVIL_FRAME" not in str(view)
    assert "node node-a is reported by another connected agent" in log
    assert "ignoring an answer to stack request" in log
