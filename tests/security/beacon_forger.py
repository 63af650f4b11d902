"""Forged beacons made to cost their reader: each claims a huge world with every group slot a
whole-world group (a few bytes on disk, a million ranks each when a reader lists them), names a
process that is not the forger's, and is rewritten every second (a new file each time, so the
agent, which looks again at a refused beacon once it changes, reads it again).

python beacon_forger.py BEACON_DIR SECONDS CLAIMS_JSON   (CLAIMS_JSON: [[pid, world], ...])
Writes one beacon per claim in this user's own subdirectory, prints "ready PATH..." once they
are all there, rewrites them every second for SECONDS, then exits (the files stay).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from watchdog.beacon import MAX_GROUPS, BeaconWriter, Identity, beacon_path
from watchdog.beacondir import user_dir


def forge(directory: str, pid: int, world: int) -> tuple[str, bytes]:
    """The bytes the hook itself would write for a rank of `world` in MAX_GROUPS whole-world
    groups, made in a private directory: the forger keeps neither the file nor a mapping."""
    with tempfile.TemporaryDirectory() as private:
        identity = Identity("forged", 0, 0, world, "node-a", pid, time.time())
        writer = BeaconWriter(os.path.join(private, "x.beacon"), identity)
        everyone = tuple(range(world))
        for n in range(MAX_GROUPS):
            writer.group_slot(str(n), everyone, world)
        writer.heartbeat(time.time())
        writer.close()
        with open(os.path.join(private, "x.beacon"), "rb") as f:
            return beacon_path(directory, "forged", 0, pid), f.read()


def rewrite(path: str, data: bytes) -> None:
    """A new file in place of the old (a hidden name first: the agent skips those)."""
    hidden = os.path.join(os.path.dirname(path), "." + os.path.basename(path))
    with open(hidden, "wb") as f:
        f.write(data)
    os.replace(hidden, path)


def main(base: str, seconds: float, claims: list[list[int]]) -> None:
    fd, directory = user_dir(base)
    os.close(fd)
    forged = [forge(directory, pid, world) for pid, world in claims]
    for path, data in forged:
        rewrite(path, data)
    print("ready", *(path for path, _ in forged), flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        for path, data in forged:
            rewrite(path, data)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3]))
