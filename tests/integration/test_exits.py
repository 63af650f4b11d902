"""How a rank ended, and the attempts torchrun restarts, under `watchdog run` with the thresholds
a user gets by default (real torchrun, gloo, py-spy, the kernel's process events)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.harness import EXIT_HANG_KILLED, stored


def test_a_rank_killed_by_sigkill_is_said_to_be(watch: Any) -> None:
    run = watch("--fault", "killed", "--fault-rank", "1", "--fault-step", "2", nproc=2,
                watchdog_args=("--on-hang", "kill"))
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["culprit_ranks"]) == ("RANK_EXITED", [1])
    assert run.rank(1)["exit_reason"] == {"signal": "SIGKILL"}
    assert run.rank(1)["exit_code"] is None
    assert run.incident["summary"].startswith("rank 1 was killed by SIGKILL at ")
    assert "EXITED (SIGKILL)" in run.output


def test_each_torchrun_attempt_is_its_own_job_and_restart_ends_the_hung_one(
        watch: Any, tmp_path: Path) -> None:
    """Attempt 0: rank 1 raises at step 3. Attempt 1: rank 2 blocks reading a sample. Under
    --on-hang restart the hung attempt's workers end, and torchrun, out of restarts, fails."""
    run = watch("--fault", "crash", "--fault-rank", "1", "--fault-step", "3",
                "--restart-fault", "data_stall", "--restart-fault-rank", "2", nproc=3,
                launcher=("--max-restarts=1",), watchdog_args=("--on-hang", "restart"))
    assert run.returncode not in (0, EXIT_HANG_KILLED), run.output
    crash, hang = stored(tmp_path)
    assert (crash["kind"], crash["culprit_ranks"], crash["attempt"]) == ("RANK_EXITED", [1], 0)
    raised = crash["ranks"][1]["exit_reason"]["exception"]
    assert (raised["type"], raised["message"]) == (
        "RuntimeError", "shard 7 is corrupt: expected 4096 records, found 17")
    assert raised["frames"][0]["function"] == "read_shard"
    assert crash["summary"].startswith("rank 1 raised RuntimeError: shard 7 is corrupt: "
                                       "expected 4096 records, found 17 at train.py:")
    assert (hang["kind"], hang["culprit_ranks"], hang["attempt"]) == ("MISSING_RANKS", [2], 1)
    assert hang["job_id"] == f"{crash['job_id']}/attempt1"
    assert hang["waiting_ranks"] == [0, 1]
    assert "read_sample_from_storage" in [f["function"] for f in hang["ranks"][2]["stack"]]
    # the second incident's ranks are the new workers, alive, and nothing of attempt 0
    old_pids = {row["pid"] for row in crash["ranks"]}
    assert not old_pids & {row["pid"] for row in hang["ranks"]}
    assert [row["state"] for row in hang["ranks"]] == ["WAITING", "WAITING", "STALLED"]
    assert f"ending the 3 workers of {hang['job_id']}" in run.output


def test_every_rank_raising_the_same_error_is_one_bug_not_one_rank(
        watch: Any, tmp_path: Path) -> None:
    """Every rank builds its DataLoader with a DistributedSampler and shuffle=True: four exits
    milliseconds apart, one verdict naming all four, with the fix."""
    run = watch("--mistake", "sampler_shuffle", watchdog_args=("--on-hang", "kill"))
    exits = [i for i in stored(tmp_path) if i["kind"] == "RANK_EXITED"]
    assert len(exits) == 1, run.output
    incident = exits[0]
    assert incident["culprit_ranks"] == [0, 1, 2, 3], incident["summary"]
    assert incident["summary"].startswith(
        "all 4 ranks raised ValueError: sampler option is mutually exclusive with shuffle at "
        "train.py:")
    assert incident["summary"].endswith(": a bug in the code, not a rank to blame")
    assert {row["exit_reason"]["exception"]["type"] for row in incident["ranks"]} == {
        "ValueError"}
    assert incident["advice"]["category"] == "API_MISUSE"
    assert "DistributedSampler(dataset, shuffle=True)" in incident["advice"]["fix"]
