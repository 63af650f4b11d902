"""The tiers: each test is marked with its directory under tests/ (unit, integration, security,
system, bench) and with `browser` when it takes the browser fixture, so that `pytest -m unit` is
the fast loop; a tier this run selects whose machine preflight fails stops the run at once, with
the fix. xdist hands out tests one by one (`--dist loadgroup`), a module's together where they
share a module-scoped fixture, the tests of long jobs first and the long tiers before the short
ones; the run ends with the time each tier took (tests/helpers/tier_times.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import everyone, preflights
from tests.helpers.tier_times import CpuPerPhase, TierTimes

TESTS = Path(__file__).resolve().parent
TIERS = frozenset({"unit", "integration", "security", "system", "bench"})
# The order tests are handed out in: the long tiers first, so the short ones fill in at the end.
ORDER = ("system", "integration", "security", "unit")
_checked: set[str] = set()  # tiers whose preflight passed in this process


def tier_of(path: Path) -> str | None:
    """The tier of a test file: its first directory under tests/."""
    try:
        directory = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return directory if directory in TIERS else None


def _may_select(config: pytest.Config, tier: str) -> bool:
    """Whether `-m` may select a test of `tier`, whatever other markers it has; True when in
    doubt. A tier it cannot select is not even imported: `-m unit` loads no daemon's tests."""
    text = config.option.markexpr
    if not text:
        return True
    try:  # pytest's own parser of `-m`, which it does not export
        from _pytest.mark.expression import Expression

        expression = Expression.compile(text)
        free = sorted(expression.idents() - TIERS - {"browser"})
    except Exception:  # moved or changed: collect the tier, and let `-m` deselect
        return True
    if tier == "integration":
        free.append("browser")  # only integration tests take the browser
    if len(free) > 10:
        return True
    for values in itertools.product((False, True), repeat=len(free)):
        marked = {name for name, on in zip(free, values, strict=True) if on} | {tier}
        if expression.evaluate(_carrying(marked)):
            return True
    return False


def _carrying(marked: set[str]) -> Callable[..., bool]:
    """A matcher for `-m`: a test with exactly the markers `marked`."""
    return lambda name, /, **kwargs: name in marked


def pytest_configure(config: pytest.Config) -> None:
    """Before xdist starts its workers, which inherit it: the copy of the package every user
    may run, for the tiers that run Python as another user (tests/helpers/everyone.py)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(TierTimes(tier_of, config.rootpath), "tier-times")
    config.pluginmanager.register(CpuPerPhase(), "cpu-per-phase")  # where tests run
    if (os.geteuid() == 0 and not hasattr(config, "workerinput")
            and any(_may_select(config, tier) for tier in ("integration", "security"))):
        with contextlib.suppress(everyone.Unprepared):  # the tier's preflight says why
            everyone.prepare()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.parent == TESTS and collection_path.name in TIERS:
        return None if _may_select(config, collection_path.name) else True
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers, and xdist groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker("browser")
        if _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=_handed_out)  # stable: a module's tests stay together


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the item takes a fixture made once per module: its module's tests then run on
    one worker, which makes it once (pytest has no public API for a fixture's scope)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        definitions[-1].scope in ("module", "package")
        for definitions in info.name2fixturedefs.values() if definitions)


def _handed_out(item: pytest.Item) -> tuple[bool, int]:
    """First the tests of long jobs (`long_job`), which the others fill in around; then the
    tiers in ORDER."""
    tier = tier_of(item.path)
    return (item.get_closest_marker("long_job") is None,
            ORDER.index(tier) if tier in ORDER else len(ORDER))


def _stop_unless_ready(config: pytest.Config, tiers: set[str | None]) -> None:
    """Each selected tier's preflight, once; the run stops at the first that fails."""
    if config.option.collectonly:
        return
    for tier, check in preflights.BY_TIER.items():
        if tier in tiers and tier not in _checked:
            problem = check()
            if problem:
                pytest.exit(problem, returncode=4)
            _checked.add(tier)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # under xdist, the controller checks
        _stop_unless_ready(session.config, {tier_of(item.path) for item in session.items})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """xdist's controller collects nothing itself: the selection is what its workers report,
    before any test is handed out (an exit in a worker would only crash it)."""
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    _stop_unless_ready(config, {tier_of(config.rootpath / i.split("::")[0]) for i in ids})
