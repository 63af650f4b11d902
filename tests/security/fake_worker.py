"""A process that writes a beacon of its choosing, as a rank would, and heartbeats until killed:
the victim job's ranks, or an attacker's forgery, in the security tests. No torch: only the
hook's own beacon code, so it starts in a fraction of a second.

python fake_worker.py SPEC_JSON   (keys: beacon_dir, job, rank, world, steps, host, pid, groups:
[[name, ranks, op, entered_seq, completed_seq], ...], frame: a function name to wait in)
Prints "ready PATH" once the beacon is published, then waits in `frame` (a name of any text).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import types

from watchdog.beacon import MAX_GROUPS, NOT_ENTERED, BeaconWriter, Identity, beacon_path
from watchdog.beacondir import user_dir


def main(spec: dict) -> None:  # type: ignore[type-arg]
    pid = spec.get("pid", os.getpid())
    identity = Identity(spec["job"], spec["rank"], spec.get("local_rank", spec["rank"]),
                        spec["world"], spec.get("host", "node-a"), pid, time.time())
    fd, directory = user_dir(spec["beacon_dir"])
    writer = BeaconWriter(beacon_path(directory, spec["job"], spec["rank"], pid), identity, fd)
    entered = [NOT_ENTERED] * MAX_GROUPS
    completed = {}
    for name, ranks, op, entered_seq, completed_seq in spec.get("groups", []):
        slot = writer.group_slot(name, tuple(ranks), spec["world"])
        entered[slot] = (entered_seq, op.encode(), time.time() - 30)
        completed[slot] = completed_seq
    writer.publish(spec.get("steps", 10), entered, completed, time.time() - 30)
    beat = threading.Thread(target=heartbeat, args=(writer,), daemon=True)
    beat.start()
    print("ready", writer.path, flush=True)
    wait_in(spec.get("frame", "wait_forever"), spec.get("file", "fake_worker.py"))


def heartbeat(writer: BeaconWriter) -> None:
    while True:
        writer.heartbeat(time.time())
        time.sleep(0.2)


def wait_in(function: str, filename: str) -> None:
    """Sleep inside a function of any name, in a file of any name, as py-spy will show it."""
    code = compile("def f():\n    while True:\n        sleep(1)\n", filename, "exec")
    body = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    waiting = types.FunctionType(body.replace(co_name=function, co_qualname=function),
                                 {"sleep": time.sleep})
    waiting()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
