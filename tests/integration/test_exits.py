"""How a rank ended, and the attempts torchrun restarts, under `watchdog run` with the thresholds
a user gets by default (real torchrun, gloo, py-spy, the kernel's process events)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import EXIT_HANG_KILLED, FLOOR_S, assert_called_at, fault_time, stored

LEAVES_BEFORE_JOINING = str(Path(__file__).parents[1] / "jobs" / "leaves_before_joining.py")


def test_a_rank_killed_by_sigkill_is_said_to_be(watch: Any) -> None:
    run = watch("--fault", "killed", "--fault-rank", "1", "--fault-step", "2", nproc=2,
                watchdog_args=("--on-hang", "kill"))
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["culprit_ranks"]) == ("RANK_EXITED", [1])
    assert run.rank(1)["exit_reason"] == {"signal": "SIGKILL"}
    assert run.rank(1)["exit_code"] is None
    assert run.incident["summary"].startswith("rank 1 was killed by SIGKILL at ")
    assert "EXITED (SIGKILL)" in run.output


@pytest.mark.parametrize("on_hang", ["kill", "restart"])
def test_torchrun_restarts_after_an_exit_and_the_next_attempts_hang_is_named_at_the_floor(
        watch: Any, tmp_path: Path, on_hang: str) -> None:
    """Attempt 0: rank 2 raises at step 3, and torchrun restarts every worker: an exit is its to
    handle. Attempt 1, a job of its own: rank 1 blocks reading a sample, named at the floor as
    in a first attempt. --on-hang kill ends the job; restart ends the attempt's workers, and
    torchrun, out of restarts, fails the job."""
    run = watch("--fault", "crash", "--fault-rank", "2", "--fault-step", "3",
                "--restart-fault", "data_stall", "--restart-fault-rank", "1",
                launcher=("--max-restarts=1",), watchdog_args=("--on-hang", on_hang))
    crash, hang = (i for i in stored(tmp_path) if i["severity"] == "hang")
    assert (crash["kind"], crash["culprit_ranks"], crash["attempt"]) == ("RANK_EXITED", [2], 0)
    raised = crash["ranks"][2]["exit_reason"]["exception"]
    assert (raised["type"], raised["message"]) == (
        "RuntimeError", "shard 7 is corrupt: expected 4096 records, found 17")
    assert crash["summary"].startswith("rank 2 raised RuntimeError: shard 7 is corrupt: "
                                       "expected 4096 records, found 17 at train.py:")
    assert (hang["kind"], hang["culprit_ranks"], hang["attempt"]) == ("MISSING_RANKS", [1], 1)
    assert hang["job_id"] == f"{crash['job_id']}/attempt1"
    assert not {row["pid"] for row in crash["ranks"]} & {row["pid"] for row in hang["ranks"]}
    assert_called_at(FLOOR_S, hang["detected_at"], fault_time(run.output, "data_stall"))
    assert ("2 attempts: attempt 0 ended when rank 2 raised RuntimeError (RANK_EXITED, torchrun "
            "restarted it); attempt 1 hung (MISSING_RANKS) and was ended by the watchdog "
            f"(--on-hang {on_hang}); 2 incidents (1 exit, 1 hang)"
            ) in run.output.rstrip().splitlines()[-1], run.output
    if on_hang == "kill":
        assert run.returncode == EXIT_HANG_KILLED, run.output
    else:
        assert run.returncode not in (0, EXIT_HANG_KILLED), run.output
        assert f"ending the 4 workers of {hang['job_id']}" in run.output


@pytest.mark.long_job
def test_a_rank_that_left_cleanly_while_its_peers_wait_ends_the_job_a_threshold_later(
        watch: Any, tmp_path: Path) -> None:
    """Rank 3 exits 0 before it joins; its peers wait for it in init_process_group, and torchrun
    waits for them: the job is hung, not the launcher's to end."""
    run = watch(script=LEAVES_BEFORE_JOINING, watchdog_args=("--on-hang", "kill"))
    assert run.returncode == EXIT_HANG_KILLED, run.output
    (left,) = stored(tmp_path)
    assert (left["kind"], left["culprit_ranks"]) == ("RANK_EXITED", [3])
    assert left["ranks"][3]["exit_code"] == 0
    said = re.search(r"watchdog: ranks 0-2 still wait (\d+) s after rank 3 exited, and the "
                     r"launcher did not end them: ending the job \(--on-hang kill\)\n",
                     run.output)
    assert said is not None, run.output
    assert int(said[1]) >= FLOOR_S
    last = run.output.rstrip().splitlines()[-1]
    assert last.startswith("watchdog: ended the job after "), run.output
    assert "(exit code 3): ranks 0-2 still waited " in last
    assert "hung job" not in run.output


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
