"""Attack 8, a full /dev/shm: another user fills it, and a rank starts. Its hook reserves the
beacon's space before touching it, finds none, says so in one line and stays off; training runs
to the end. (A 64 KiB tmpfs mounted for the test stands for /dev/shm.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.attack import AS_NOBODY, WATCHDOG, clean_env, scratch_dir
from watchdog.beacon import SIZE

TRAIN = ("import torch\n"
         "model = torch.nn.Linear(4, 1)\n"
         "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
         "for step in range(5):\n"
         "    optimizer.zero_grad(); model(torch.ones(4)).sum().backward(); optimizer.step()\n"
         "print('trained 5 steps', flush=True)\n")


@pytest.fixture
def small_shm() -> Iterator[Path]:
    with scratch_dir() as scratch:
        mount = scratch / "shm"
        mount.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=1777", "tmpfs",
                        str(mount)], check=True)
        try:
            yield mount
        finally:
            subprocess.run(["umount", str(mount)], check=True)


def test_training_goes_on_when_the_beacon_has_no_room(small_shm: Path) -> None:
    # The attacker takes every page there is.
    subprocess.run([*AS_NOBODY, "sh", "-c", f"head -c 1M /dev/zero > {small_shm}/fill"],
                   check=False, cwd="/")
    assert os.statvfs(small_shm).f_bavail == 0
    run = subprocess.run([*WATCHDOG, "launch", "--", sys.executable, "-c", TRAIN],
                         capture_output=True, text=True, timeout=120, cwd="/",
                         env=clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                                       WATCHDOG_BEACON_DIR=str(small_shm / "thw")))
    assert run.returncode == 0, run.stderr
    assert run.stdout == "trained 5 steps\n"
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"torch-hang-watchdog: hook not installed: cannot reserve {SIZE} "
                           "bytes for the beacon: No space left on device")
    assert line.endswith("; training goes on without it")
