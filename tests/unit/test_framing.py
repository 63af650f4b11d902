"""What `watchdog run` says around the job: the threshold, the next step after a hang it leaves
running, and the closing line (how the job ended, its incidents, or that nothing was watched)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from agent.daemon import Agent
from tests.helpers.builders import JOB, entered, incident, raised, rank, snapshot
from watchdog.coordinator import Coordinator, StallPolicy
from watchdog.coordinator.after_exit import StillHung
from watchdog.coordinator.database import database_of
from watchdog.coordinator.incident import build_incident
from watchdog.coordinator.persist import Unstored
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.coordinator.verdict import decide
from watchdog.supervise.embedded import RunOptions, _Run
from watchdog.supervise.framing import (
    Ended,
    RunEnd,
    db_option,
    ended_text,
    ending_text,
    next_steps_text,
    threshold_text,
)

DB = "/home/you/.local/state/torch-hang-watchdog/incidents.db"
NOTICE = {**incident(), "id": "b0b0b0b0b0b0", "kind": "RANK_BUSY", "severity": "notice"}


def exit_incident() -> dict[str, Any]:
    """Rank 2 raised ValueError while ranks 0, 1 and 3 wait in all_reduce #57."""
    job = snapshot(*(rank(r, entered(57, 3.0)) for r in (0, 1, 3)), raised(2, at=4.0))
    verdict = decide(job)
    assert verdict is not None
    return build_incident(job, verdict, "e0e0e0e0e0e0", job.now)


EXITED = exit_incident()
STILL = StillHung(EXITED, 10.2, (0, 1, 3))


def test_the_threshold_in_force() -> None:
    assert threshold_text(StallPolicy(fixed=3.0)) == (
        "hung after 3 s without progress (--stall-timeout)")
    assert threshold_text(StallPolicy()) == (
        "hung after 10 s without progress (5 x the job's pace if longer; up to 60 s at start-up)")


def test_after_a_hang_left_running_the_incident_and_what_to_do() -> None:
    text = next_steps_text(incident(), DB)
    assert text.startswith(f"watchdog: hang incident 9c1e04d2b7aa is stored in {DB}. The job is "
                           "still hung: Ctrl-C ends it (--on-hang kill would have ended it);")
    assert "`watchdog incidents show 9c1e04d2b7aa --html report.html`" in text


def test_the_closing_line_says_how_the_job_ended_and_what_was_seen() -> None:
    hang = incident()
    assert ended_text(RunEnd(0, 41.6, [], DB, watched=True)) == (
        "watchdog: the job ended after 42 s with exit code 0; no incident")
    assert ended_text(RunEnd(1, 12, [NOTICE, hang], DB, watched=True)) == (
        "watchdog: the job ended after 12 s with exit code 1; 2 incidents (1 hang, 1 notice), "
        "stored in "
        f"{DB}: `watchdog incidents show 9c1e04d2b7aa` shows the latest")
    killed = ended_text(RunEnd(3, 20, [hang], DB, watched=True, ended=[Ended("kill", hang)]))
    assert killed.startswith(f"watchdog: ended the hung job after 20 s (exit code 3): "
                             f"{hang['summary']}; 1 incident (1 hang)")
    assert ended_text(RunEnd(130, 5, [], DB, watched=True, interrupted=True)) == (
        "watchdog: the job ended after 5 s, interrupted (exit code 130); no incident")


def test_an_unwatched_job_does_not_look_like_a_healthy_one() -> None:
    plain = ended_text(RunEnd(0, 1, [], DB, watched=False))
    assert plain.startswith("watchdog: the job ended after 1 s with exit code 0; no rank of it "
                            "reported, so nothing was watched: a process reports once it is a "
                            "torch.distributed rank")
    failed = ended_text(RunEnd(1, 6, [], DB, watched=False))
    assert failed.startswith("watchdog: the job ended after 6 s with exit code 1, before any "
                             "rank of it reached torch.distributed: the cause is in its output "
                             "above")
    # Ranks report from interpreter start: a script that is missing was still "watched".
    assert ended_text(RunEnd(1, 2, [], DB, watched=True)) == failed.replace("6 s", "2 s")


def test_a_job_that_failed_with_no_incident_is_pointed_at_its_own_output() -> None:
    assert ended_text(RunEnd(1, 30, [], DB, watched=True, distributed=True)).startswith(
        "watchdog: the job ended after 30 s with exit code 1; no incident: the cause is in its "
        "output above")


def test_an_exit_the_launcher_ended_is_said_to_be_no_end_of_the_watchdog() -> None:
    assert ended_text(RunEnd(1, 7, [EXITED], DB, watched=True)).startswith(
        "watchdog: the job ended after 7 s with exit code 1; rank 2 raised ValueError "
        "(RANK_EXITED); the watchdog ended nothing; 1 incident (1 exit), stored in ")


def test_an_exit_whose_peers_still_wait_is_ended_in_words_of_what_happened() -> None:
    ended = Ended("kill", EXITED, STILL)
    assert ending_text(ended, "the job") == (
        "watchdog: ranks 0,1,3 still wait 10 s after rank 2 exited, and the launcher did not "
        "end them: ending the job (--on-hang kill)")
    assert ending_text(Ended("kill", incident()), "the hung job") == (
        "watchdog: ending the hung job (--on-hang kill)")
    closing = ended_text(RunEnd(3, 75, [EXITED], DB, watched=True, ended=[ended]))
    assert closing.startswith(
        "watchdog: ended the job after 75 s (exit code 3): ranks 0,1,3 still waited 10 s after "
        f"rank 2 exited, and the launcher did not end them; {EXITED['summary']}; 1 incident "
        "(1 exit), stored in ")
    assert "hung" not in closing
    advice = next_steps_text(EXITED, DB, STILL)
    assert advice.startswith(
        "watchdog: ranks 0,1,3 still wait 10 s after rank 2 exited, and the launcher did not end "
        f"them; incident e0e0e0e0e0e0 (RANK_EXITED) is stored in {DB}. The job is still hung: ")


def test_the_closing_line_tells_each_attempt_torchrun_ran() -> None:
    hang = {**incident(), "job_id": f"{JOB}/attempt1", "attempt": 1}
    killed = ended_text(RunEnd(3, 95, [EXITED, hang], DB, watched=True,
                               ended=[Ended("kill", hang)], attempts=2))
    assert killed.startswith(
        f"watchdog: ended the hung job after 95 s (exit code 3): {hang['summary']}; 2 attempts: "
        "attempt 0 ended when rank 2 raised ValueError (RANK_EXITED, torchrun restarted it); "
        "attempt 1 hung (MISSING_RANKS) and was ended by the watchdog (--on-hang kill); "
        "2 incidents (1 exit, 1 hang), stored in ")
    # --on-hang restart: attempt 1's peers still wait after its exit, attempt 2 hangs
    second = {**EXITED, "attempt": 1}
    third = {**hang, "attempt": 2}
    restarted = ended_text(RunEnd(1, 60, [EXITED, second, third], DB, watched=True, attempts=3,
                                  ended=[Ended("restart", second, STILL),
                                         Ended("restart", third)]))
    assert restarted.startswith(
        "watchdog: the job ended after 60 s with exit code 1; 3 attempts: attempt 0 ended when "
        "rank 2 raised ValueError (RANK_EXITED, torchrun restarted it); attempt 1: rank 2 raised "
        "ValueError (RANK_EXITED), ranks 0,1,3 still waited 10 s later and were ended by the "
        "watchdog (--on-hang restart, torchrun restarted it); attempt 2 hung (MISSING_RANKS) and "
        "was ended by the watchdog (--on-hang restart); 3 incidents (2 exits, 1 hang)"), restarted
    alone = ended_text(RunEnd(1, 30, [incident()], DB, watched=True,
                              ended=[Ended("restart", incident())]))
    assert alone.startswith(  # torchrun had no restart left
        "watchdog: the job ended after 30 s with exit code 1; 1 attempt: attempt 0 hung "
        "(MISSING_RANKS) and was ended by the watchdog (--on-hang restart); 1 incident (1 hang)")


def test_run_acts_on_an_exit_only_once_its_peers_still_wait(tmp_path: Path) -> None:
    out = io.StringIO()
    hub = Coordinator(SqliteStore(str(tmp_path / "incidents.db")), StallPolicy())
    run = _Run(RunOptions(["job"], StallPolicy(), on_hang="kill"), out,
               Agent(None, str(tmp_path), "node"), hub)
    run.on_incident(EXITED)
    assert not run.kill.is_set() and run.ended == []  # the launcher's to handle
    run.on_still_hung(STILL)
    assert run.kill.is_set() and run.killed == Ended("kill", EXITED, STILL)


def test_a_warning_only_run_counts_its_warning_as_hangs_are_counted() -> None:
    warning = {**incident(), "kind": "NO_GRAD_SYNC", "severity": "warning"}
    assert "; 1 incident (1 warning), stored in " in ended_text(
        RunEnd(0, 3, [warning], DB, watched=True))


def test_incidents_the_database_refused_are_said_to_be_where_they_are() -> None:
    kept = ended_text(RunEnd(1, 3, [incident()], DB, watched=True,
                             unstored=Unstored(1, f"{DB}.pending")))
    assert kept.endswith(f"1 incident (1 hang); not stored: {DB} refused them; they wait in "
                         f"{DB}.pending, stored the next time a watchdog opens {DB}")
    lost = ended_text(RunEnd(1, 3, [NOTICE, incident()], DB, watched=True,
                             unstored=Unstored(1, None)))
    assert lost.endswith(f"; 1 of them not stored: {DB} refused them, and they are only printed "
                         "above")


def test_the_commands_suggested_name_a_database_incidents_would_not_find(
        tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("WATCHDOG_DB", str(tmp_path / "usual.db"))
    assert db_option(database_of(None)) == ""
    own = database_of(str(tmp_path / "my own.db"))
    assert db_option(own) == f" --db '{tmp_path / 'my own.db'}'"
    text = ended_text(RunEnd(0, 3, [incident()], str(own), watched=True,
                             db_option=db_option(own)))
    assert text.endswith(f"`watchdog incidents show 9c1e04d2b7aa --db '{tmp_path / 'my own.db'}'` "
                         "shows the latest")
    assert f"show 9c1e04d2b7aa --db '{tmp_path / 'my own.db'}' --html report.html`" in (
        next_steps_text(incident(), str(own), option=db_option(own)))
