"""Fixtures the unit tests take by name."""

from __future__ import annotations

from tests.helpers.recorders import one_rank  # noqa: F401 (a gloo group of this process alone)
