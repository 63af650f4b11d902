"""System tests: the shipped units, image and manifests run the way operators run them. They need
root and systemd-nspawn (tests/system-deps.sh installs it); elsewhere they skip, saying why."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers.secured import certs  # noqa: F401 (a CA and certificates, per test module)


@pytest.fixture(scope="session", autouse=True)
def system_machine() -> None:
    if os.geteuid() != 0:
        pytest.skip("system tests boot machines and build images: they run as root")
    if shutil.which("systemd-nspawn") is None or shutil.which("mmdebstrap") is None:
        pytest.skip("system tests need systemd-nspawn and mmdebstrap: tests/system-deps.sh")
