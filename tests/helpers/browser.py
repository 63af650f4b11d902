"""Real headless Chromium (Debian's package) driven by Playwright, for the tests of the HTML
report and the web view. A missing browser fails the test with the fix: it never skips."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# The machine reaches no network: nothing may try to. Root needs --no-sandbox.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS_ENV = "WATCHDOG_TEST_ARTIFACTS"


@contextmanager
def chromium() -> Iterator[Any]:
    """A Playwright Browser on Debian's chromium."""
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("Chromium is not installed: `apt-get update && apt-get install -y chromium` "
                    "(Debian's package; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is not installed: `pip install -e '.[test]'` (only its Python "
                    "package; the browser is Debian's chromium, never `playwright install`)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, directory: Path, name: str) -> Path:
    """A full-page PNG in `directory` and, when $WATCHDOG_TEST_ARTIFACTS is set, there too."""
    path = directory / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000, "an empty screenshot"
    artifacts = os.environ.get(ARTIFACTS_ENV)
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / name)
    return path
