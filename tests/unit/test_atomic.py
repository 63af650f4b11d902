"""write_atomically on a real file system: the new text whole, a link at the path replaced and
not followed, and nothing left behind when the write fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from watchdog.atomic import write_atomically


def test_a_link_at_the_path_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("kept")
    (tmp_path / "report").symlink_to(target)
    write_atomically(str(tmp_path / "report"), "new")
    assert target.read_text() == "kept"
    assert not (tmp_path / "report").is_symlink()
    assert (tmp_path / "report").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["report", "target"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    (tmp_path / "report").mkdir()  # rename cannot replace a directory with a file
    with pytest.raises(IsADirectoryError):
        write_atomically(str(tmp_path / "report"), "new")
    assert os.listdir(tmp_path) == ["report"]
