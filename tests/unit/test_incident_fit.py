"""An incident over its byte budget is cut (coordinator/fit.py): each stack keeps its innermost
frames and a mark counting every frame not shown, those an earlier cut hid included."""

from __future__ import annotations

import dataclasses
from typing import Any

from watchdog.coordinator.fit import fit
from watchdog.frames import TRUNCATED_FILE, hidden_by
from watchdog.model import Frame, bounded_frames


def stack(depth: int, limit: int) -> list[dict[str, Any]]:
    """A rank's stack as an incident holds it, already cut to `limit` where it entered."""
    return [dataclasses.asdict(f) for f in bounded_frames(
        [Frame("f" * 200, "train.py", line) for line in range(depth)], limit)]


def test_a_cut_stack_says_how_many_frames_all_cuts_hid() -> None:
    incident = {"id": "i", "ranks": [{"rank": 0, "stack": stack(600, 512),
                                      "children": [{"pid": 9, "stack": stack(130, 128)}]}]}
    cut = fit(incident, 20_000)
    (rank,) = cut["ranks"]
    for frames, depth in ((rank["stack"], 600), (rank["children"][0]["stack"], 130)):
        *kept, mark = frames
        assert mark["file"] == TRUNCATED_FILE
        assert len(kept) + hidden_by(mark["function"]) == depth, mark
        assert kept == stack(depth, 512)[:len(kept)]
