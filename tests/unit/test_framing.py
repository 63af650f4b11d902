"""What `watchdog run` says around the job: the threshold, the next step after a hang it leaves
running, and the closing line (how the job ended, its incidents, or that nothing was watched)."""

from __future__ import annotations

from tests.helpers.builders import incident
from watchdog.cli.framing import RunEnd, ended_text, next_steps_text, threshold_text
from watchdog.coordinator import StallPolicy

DB = "/home/you/.local/state/torch-hang-watchdog/incidents.db"
NOTICE = {**incident(), "id": "b0b0b0b0b0b0", "kind": "RANK_BUSY", "severity": "notice"}


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
        "watchdog: the job ended after 12 s with exit code 1; 2 incidents (1 hang), stored in "
        f"{DB}: `watchdog incidents show 9c1e04d2b7aa` shows the latest")
    killed = ended_text(RunEnd(3, 20, [hang], DB, watched=True, killed_for=hang))
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
