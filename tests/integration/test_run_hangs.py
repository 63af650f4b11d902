"""`watchdog run` on real 3-rank gloo jobs, each with one injected fault (real py-spy, gRPC); the
pipeline has 4 stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import EXIT_HANG_KILLED

PIPELINE = str(Path(__file__).parents[1] / "jobs" / "pipeline.py")
NPROC = 3  # a culprit and a majority waiting on it: a fourth rank would add CPU, not a case


def assert_collective(run: Any, group: str, op: str, members: list[int]) -> None:
    assert run.incident is not None
    collective = run.incident["collective"]
    assert collective["group"] == group
    assert collective["op"] == op
    assert collective["ranks"] == members
    assert collective["seq"] > 0


def test_rank_blocked_in_data_pipeline(watch) -> None:
    run = watch("--fault", "data_stall", "--fault-rank", "1", "--fault-step", "4")
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "MISSING_RANKS"
    assert run.incident["culprit_ranks"] == [1]
    assert run.incident["waiting_ranks"] == [0, 2]
    assert_collective(run, "0", "all_reduce", [0, 1, 2])
    assert "read_sample_from_storage" in run.stack_functions(1)
    assert "read_sample_from_storage" not in run.stack_functions(0)
    # The verdict is said again last, under torchrun's traceback of the end it was given.
    assert "SignalException" in run.output
    last = run.output.rstrip().splitlines()[-1]
    assert last.startswith("watchdog: ended the hung job after "), run.output
    assert f"(exit code 3): {run.incident['summary']}; 1 incident (1 hang)" in last


def test_rank0_deadlocked_on_a_lock(watch) -> None:
    run = watch("--fault", "lock", "--fault-rank", "0", "--fault-step", "3")
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "MISSING_RANKS"
    assert run.incident["culprit_ranks"] == [0]
    assert_collective(run, "0", "all_reduce", [0, 1, 2])
    assert run.stack_functions(0)[0] == "update_metrics"


def test_rank_deadlocked_between_its_backward_and_its_optimizer_step(watch) -> None:
    """Its all-reduce of the step is done, but nothing in Python saw it finish: the peers that
    entered the next one show that it did."""
    run = watch("--fault", "lock_after_backward", "--fault-rank", "2", "--fault-step", "3")
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "MISSING_RANKS"
    assert run.incident["culprit_ranks"] == [2]
    assert run.incident["waiting_ranks"] == [0, 1]
    assert_collective(run, "0", "all_reduce", [0, 1, 2])
    assert run.rank(2)["state"] == "STALLED"
    assert run.stack_functions(2)[0] == "update_metrics"


def test_native_stacks_show_the_c_frames_under_a_deadlock(watch) -> None:
    run = watch("--fault", "lock", "--fault-rank", "0", "--fault-step", "3",
                watchdog_args=("--stall-timeout", "3", "--on-hang", "kill", "--native"))
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["culprit_ranks"] == [0]
    stack = run.rank(0)["stack"]
    assert not stack[0]["file"].endswith(".py"), run.output  # the lock wait itself, in native code
    python = [frame["function"] for frame in stack if frame["file"].endswith(".py")]
    assert python[0] == "update_metrics", stack
    assert "(stuck in update_metrics at train.py:" in run.incident["summary"]
    assert_collective(run, "0", "all_reduce", [0, 1, 2])


def test_barrier_only_one_rank_reaches(watch) -> None:
    run = watch("--fault", "barrier", "--fault-rank", "0", "--fault-step", "3")
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "COLLECTIVE_MISMATCH"
    assert run.incident["culprit_ranks"] == [0]
    # The collective is the one the culprit never reached; the summary names both sides.
    assert_collective(run, "0", "all_reduce", [0, 1, 2])
    assert " is in barrier #" in run.incident["summary"]
    assert "save_checkpoint" in run.stack_functions(0)


@pytest.mark.parametrize(("exit_code", "exit_seconds"), [(0, 0), (3, 6)])
def test_rank_leaves_early_with_its_exit_code(watch, exit_code: int, exit_seconds: int) -> None:
    """Its peers raise when their connection drops (gloo), and torchrun ends the job: the
    watchdog, under --on-hang kill, ends nothing (an exit is the launcher's to handle), even
    where the leaving rank's exit handlers take twice the stall threshold (6 s)."""
    run = watch("--fault", "early_exit", "--fault-rank", "2", "--fault-step", "3",
                "--exit-code", str(exit_code), "--exit-seconds", str(exit_seconds))
    assert run.returncode not in (0, EXIT_HANG_KILLED), run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "RANK_EXITED"
    assert run.incident["culprit_ranks"] == [2]
    assert run.rank(2)["exit_code"] == exit_code
    assert f"exit code {exit_code}, clean shutdown" in run.incident["summary"]
    assert_collective(run, "0", "all_reduce", [0, 1, 2])
    assert "watchdog: ending" not in run.output
    assert (f"; rank 2 exited with code {exit_code} (RANK_EXITED); the watchdog ended nothing; "
            "1 incident (1 exit)") in run.output.rstrip().splitlines()[-1], run.output


def test_a_rank_that_raises_and_leaves_slowly_is_left_to_the_launcher(watch) -> None:
    """Rank 2 raises, and its exit handlers (a logger's last upload, say) take twice the stall
    threshold while its peers wait: it is leaving, not hung. torchrun ends the job once it is
    gone; the watchdog, under --on-hang kill, ends nothing."""
    run = watch("--fault", "crash", "--fault-rank", "2", "--fault-step", "3",
                "--exit-seconds", "6")
    assert run.returncode not in (0, EXIT_HANG_KILLED), run.output
    assert run.incident is not None, run.output
    assert (run.incident["kind"], run.incident["culprit_ranks"]) == ("RANK_EXITED", [2])
    assert run.incident["summary"].startswith("rank 2 raised RuntimeError: shard 7 is corrupt")
    assert "watchdog: ending" not in run.output
    assert "the watchdog ended nothing; 1 incident (1 exit)" in run.output, run.output


def test_subgroup_collective_one_member_never_reaches(watch) -> None:
    run = watch("--fault", "subgroup", "--fault-step", "3")
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "MISSING_RANKS"
    assert run.incident["culprit_ranks"] == [1]
    assert_collective(run, "1", "all_reduce", [0, 1])
    assert "load_shard" in run.stack_functions(1)


def test_healthy_job_with_slow_steps_has_no_incident(watch) -> None:
    # A floor below the 1.5 s slow step: once the warm-up has seen 8 progress intervals, only
    # the adaptive threshold (k x p99 interval) keeps the next slow steps from a false alarm.
    run = watch("--fault", "slow_steps", "--steps", "14", watchdog_args=(
        "--stall-floor", "1.0", "--stall-k", "3", "--stall-warmup", "30", "--on-hang", "kill"))
    assert run.returncode == 0, run.output
    assert run.incident is None, run.output
    assert "finished 14 steps" in run.output


def test_pipeline_stage_that_never_sends(watch) -> None:
    """Pipeline parallelism: rank 1 blocks after receiving its input; rank 0 waits to send it
    the next one, rank 2 to receive from it, rank 3 from rank 2. No collective is involved."""
    run = watch(script=PIPELINE, nproc=4)
    assert run.returncode == EXIT_HANG_KILLED, run.output
    assert run.incident is not None, run.output
    assert run.incident["kind"] == "MISSING_RANKS"
    assert run.incident["culprit_ranks"] == [1]
    assert run.incident["waiting_ranks"] == [0, 2, 3]
    assert_collective(run, "0:p2p:0-1", "isend", [0, 1])
    assert run.stack_functions(1)[0] == "load_shard"
