"""Strings from workers and agents reach terminals escaped: ESC, the other C0 and C1 controls,
DEL and invisible format characters become visible escapes; printable text is left alone."""

from __future__ import annotations

import pytest

from tests.helpers.builders import incident
from watchdog.report.terminal import render_incident, render_incident_list, render_status
from watchdog.text import printable, printable_tree


@pytest.mark.parametrize(("raw", "shown"), [
    ("all_reduce", "all_reduce"),
    ("naïve 日本 — ok", "naïve 日本 — ok"),
    ("\x1b[2J\x1b]0;title\x07", "\\x1b[2J\\x1b]0;title\\x07"),
    ("a\x9bb\x7fc\x00", "a\\x9bb\\x7fc\\x00"),
    ("tab\there\nline", "tab\\x09here\\x0aline"),
    ("\u202eevil\u2028", "\\u202eevil\\u2028"),
    ("\U000e0041", "\\U000e0041"),
])
def test_printable(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert printable(shown) == shown  # escaping twice changes nothing


def test_every_string_of_a_json_shaped_value_is_escaped() -> None:
    assert printable_tree({"k\x1b": ["\x07", 3, None, {"x": "\x9b"}]}) == {
        "k\\x1b": ["\\x07", 3, None, {"x": "\\x9b"}]}


def test_nothing_a_worker_sent_reaches_the_terminal_raw() -> None:
    hostile = incident()
    hostile["job_id"] = "job\x1b]0;pwned\x07"
    hostile["summary"] += "\x1b[2J"
    row = hostile["ranks"][0]
    row.update(host="h\x1b[31m", stack=[{"function": "f\x9b1m", "file": "\x1b]8;;x\x07a.py",
                                         "line": 1}], nccl_log=["\x1b[5mWARN"])
    row["last_collective"]["op"] = "all_reduce\x1b[8m"
    hostile["culprit_ranks"] = [row["rank"]]
    flag = {"rank": 0, "node": "n\x1b", "host": "h", "pid": 6, "world_size": 9,
            "reason": "claims world size 9; the job's is 4"}
    status = {"jobs": [{"job_id": hostile["job_id"], "state": "HUNG", "world_size": 4,
                        "nodes": ["n\x1b"], "ranks": hostile["ranks"], "verdict": hostile,
                        "flagged": [flag]}]}
    for text in (render_incident(hostile), render_status(status),
                 render_incident_list([(hostile, "head\x1b]0;pwned\x07")])):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
        assert "job\\x1b]0;pwned\\x07" in text
    assert "h\\x1b[31m" in render_status(status)
    assert ("flagged, not trusted: rank 0 (pid 6 on n\\x1b): claims world size 9; the job's is "
            "4") in render_status(status)
    assert "f\\x9b1m" in render_incident(hostile)
    assert "\x1b[" in render_incident(hostile, color=True)  # our own colours still work
