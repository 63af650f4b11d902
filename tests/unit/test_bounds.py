"""Texts and stacks a worker controls are cut where they enter, with a mark, never refused: the
job id from its environment, a log line, a deep stack, the exception its beacon records."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.logtail import read_tail
from agent.rankstate import _raised
from watchdog import env as _env
from watchdog.beacon import BeaconWriter, Identity, RaisedException, open_beacon, read_beacon
from watchdog.model import MAX_LINE, Frame, bounded_frames
from watchdog.text import MAX_TEXT, TRUNCATED, bounded
from watchdog.transport.limits import MAX_REASON_FRAMES


@pytest.mark.parametrize(("text", "limit", "expected"), [
    ("short", 64, "short"),
    ("x" * 64, 64, "x" * 64),
    ("x" * 65, 64, "x" * 50 + TRUNCATED),
    ("ab€" * 30, 64, "ab€" * 10 + TRUNCATED),  # 50 bytes hold ten whole "ab€"
    ("€" * 30, 64, "€" * 16 + TRUNCATED),  # 48 of the 50 bytes: never half a character
])
def test_bounded_cuts_on_a_character_and_marks_it(text: str, limit: int, expected: str) -> None:
    assert bounded(text, limit) == expected
    assert len(bounded(text, limit).encode()) <= limit


def test_a_long_job_id_from_the_environment_is_cut_as_a_beacon_keeps_it(tmp_path: Path) -> None:
    long = "a" * 5000
    job = _env.job_id({"WATCHDOG_JOB_ID": long})
    assert job == "a" * (_env.MAX_JOB_ID - len(TRUNCATED.encode())) + TRUNCATED
    restarted = _env.job_id({"WATCHDOG_JOB_ID": long, _env.ATTEMPT: "3"})
    assert restarted.endswith(TRUNCATED + "/attempt3")
    assert len(restarted.encode()) == _env.MAX_JOB_ID
    # The hook writes that id into its beacon: a hooked rank and one without the hook, whose id
    # the agent derives from the same environment, are one job.
    identity = Identity(job, 0, 0, 2, "node-a", 4242, 1.0)
    writer = BeaconWriter(str(tmp_path / "b.beacon"), identity)
    assert read_beacon(open_beacon(writer.path)).identity.job_id == job
    assert _env.job_id({"WATCHDOG_JOB_ID": "train-7"}) == "train-7"


def test_a_log_line_over_the_limit_is_cut_not_dropped(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_text("before\n" + "y" * 10_000 + "\nafter\n")
    assert read_tail(str(log)) == ["before", "y" * (MAX_TEXT - len(TRUNCATED.encode()))
                                   + TRUNCATED, "after"]


def test_a_deep_stack_keeps_its_innermost_frames() -> None:
    frames = [Frame("recurse", "/home/ml/train.py", 7)] * 700 + [Frame("<module>", "t.py", 1)]
    kept = bounded_frames(frames, 512)
    assert kept[:511] == tuple(frames[:511])
    assert kept[511] == Frame("…[190 outer frames not shown]", "<truncated>", 0)
    assert bounded_frames(frames[:512], 512) == tuple(frames[:512])


def test_frames_names_and_lines_are_bounded() -> None:
    (frame,) = bounded_frames([Frame("f" * 9000, "g" * 9000, 10**30)], 512)
    assert frame.function.endswith(TRUNCATED) and frame.file.endswith(TRUNCATED)
    assert len(frame.function.encode()) == len(frame.file.encode()) == MAX_TEXT
    assert frame.line == MAX_LINE


def test_an_exception_a_beacon_records_is_bounded_as_the_wire_takes_it() -> None:
    # 2 KB of JSON hold 200 tiny frames, and a line number of any size.
    frames = [("f", "", n) for n in range(199)]
    raised = RaisedException("E", "m", (*frames, ("g", "t.py", 10**40)))
    reason = _raised(raised, oom_killed=False)
    assert len(reason.frames) == MAX_REASON_FRAMES
    assert reason.frames[-1].function == "…[137 outer frames not shown]"
    one = _raised(RaisedException("E", "m", (("g", "t.py", 10**40),)), oom_killed=False)
    assert one.frames == (Frame("g", "t.py", MAX_LINE),)
