"""Fixtures the unit tests take by name, and one every unit test takes: a judgement's refused
transition raises here, where the daemon only logs it."""

from __future__ import annotations

import pytest

from tests.helpers.recorders import one_rank  # noqa: F401 (a gloo group of this process alone)
from watchdog.coordinator import judgement


@pytest.fixture(autouse=True)
def strict_judgement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judgement, "STRICT", True)
