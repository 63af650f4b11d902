"""Fixtures for integration tests (py-spy and ptrace are checked first: tests/conftest.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import postgres as pg
from tests.helpers.browser import chromium
from tests.helpers.capabilities import (  # noqa: F401 (a process of `nobody` to act on)
    other_users_worker,
)
from tests.helpers.harness import (
    JOB_TIMEOUT_S,
    WatchedRun,
    job_env,
    run_command,
    watched_run,
)
from tests.helpers.secured import certs  # noqa: F401 (a CA and certificates, per test module)
from watchdog.cli.demo import torchrun_command
from watchdog.coordinator.database import POSTGRES, SQLITE, Database, mask
from watchdog.coordinator.postgres_store import PostgresStore
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.coordinator.store import IncidentStore
from watchdog.demo import TRAIN_SCRIPT


@pytest.fixture
def watch(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """Runs the bundled training job with one fault (or another `script`) under `watchdog run`
    and torchrun, or under `watchdog run` alone the command `job` where one is given; at the
    test module's NPROC ranks unless told otherwise (4 where it has none)."""
    ranks = getattr(request.module, "NPROC", 4)

    def run(*train_args: str, nproc: int = ranks, watchdog_args: tuple[str, ...] = (
            "--stall-timeout", "3", "--on-hang", "kill"),
            launcher: tuple[str, ...] = (), script: str = TRAIN_SCRIPT,
            job: list[str] | None = None, env: dict[str, str] | None = None) -> WatchedRun:
        report = tmp_path / "incident.json"
        job = job or torchrun_command(nproc, *train_args, launcher=launcher, script=script)
        proc = subprocess.run(run_command(report, job, watchdog_args),
                              env={**job_env(tmp_path), **(env or {})},
                              capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        return watched_run(proc.returncode, proc.stdout + proc.stderr, report)

    return run


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium, one per test module (it takes a second or two to start)."""
    with chromium() as b:
        yield b


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.Cluster]:
    """A throwaway PostgreSQL server, one per test process (tests/helpers/postgres.py)."""
    problem = pg.missing()
    if problem:
        pytest.fail(problem)
    with pg.cluster() as made:
        yield made


@pytest.fixture(params=[SQLITE, POSTGRES])
def database(request: pytest.FixtureRequest, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Database:
    """An empty incident database of each backend: a file here, or a database of its own on
    the `postgres` server. A URL's spill file goes to this test's state directory."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    if request.param == SQLITE:
        path = str(tmp_path / "incidents.db")
        return Database(SQLITE, path, path)
    url = request.getfixturevalue("postgres").database()
    return Database(POSTGRES, url, mask(url))


@pytest.fixture
def make_store(database: Database) -> Callable[..., IncidentStore]:
    """A new store of `database`, its backend's class given the keywords (retention,
    busy_timeout, coordinator)."""
    backend = SqliteStore if database.kind == SQLITE else PostgresStore
    return lambda **settings: backend(database.target, **settings)
