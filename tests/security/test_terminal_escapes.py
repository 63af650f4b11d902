"""Attack 7, terminal escapes: a user's ranks put ESC and other control characters in their job
id, host, group and op names, and in the function and file names py-spy shows. `watchdog status`
and `watchdog incidents show` print them escaped, never raw."""

from __future__ import annotations

import json
import subprocess

from tests.helpers.attack import (
    AS_NOBODY,
    WATCHDOG,
    agent,
    clean_env,
    coordinator,
    hung_job,
    scratch_dir,
    shared_base,
    status,
    stored,
    verdict,
    worker,
)

JOB = "job\x1b]0;pwned\x07\x1b[2J"
RAW = ("\x1b", "\x07", "\x9b")


def hostile(spec: dict[str, object]) -> dict[str, object]:
    groups = [["g\x1b[5m", [0, 1], "all_reduce\x9b2J", *spec["groups"][0][3:]]]  # type: ignore[index]
    return {**spec, "job": JOB, "host": "host\x1b[31m", "groups": groups,
            "frame": f"{spec['frame']}\x1b[8m", "file": "\x1b]8;;http://x\x07evil.py"}


def test_strings_from_workers_reach_the_terminal_escaped() -> None:
    with scratch_dir() as scratch:
        beacons = shared_base(scratch)
        rank0, rank1 = (hostile(spec) for spec in hung_job(beacons, "unused"))
        with coordinator(scratch) as coord, \
                agent(scratch, beacons, "--coordinator", coord.address), \
                worker(rank0, AS_NOBODY), worker(rank1, AS_NOBODY):
            view = verdict(coord.address, JOB)
            table = status(coord.address, human=True)
        shown = subprocess.run([*WATCHDOG, "incidents", "show", view["verdict"]["id"], "--db",
                                str(scratch / "incidents.db")], capture_output=True, text=True,
                               timeout=60, env=clean_env())
        rows = json.loads(stored(scratch, view["verdict"]["id"]))["ranks"]  # Status has no stacks
    assert view["verdict"]["culprit_ranks"] == [1]
    # The contract's JSON keeps a text as it came (JSON escapes it), but a frame's: escaped
    # where it entered, as JSON would give each control six bytes; terminals get it escaped.
    assert rows[1]["stack"][0]["function"] == "stuck_reading_data\\x1b[8m"
    for text in (table.stdout, shown.stdout):
        assert not any(raw in text for raw in RAW), repr(text)
    assert "job\\x1b]0;pwned\\x07\\x1b[2J" in table.stdout
    assert "host\\x1b[31m" in table.stdout
    assert "all_reduce\\x9b2J" in shown.stdout
    assert "stuck_reading_data\\x1b[8m" in shown.stdout
    assert "\\x1b]8;;http://x\\x07evil.py" in shown.stdout
