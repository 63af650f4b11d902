"""How long the table keeps a worker that exited: it is still reported for a while (the
coordinator times and explains the exit from it), then forgotten, its beacon removed."""

from __future__ import annotations

from agent import beaconfiles
from agent.worker import Worker

EXITED_RETENTION_S = 300.0  # keep reporting an exited worker this long, then forget it


def expired(worker: Worker, now: float) -> bool:
    return worker.exited_at is not None and now - worker.exited_at > EXITED_RETENTION_S


def forget_old(by_path: dict[str, Worker], unhooked: dict[int, Worker], now: float) -> None:
    """Drop the workers that exited long enough ago from both parts of the table."""
    for pid in [pid for pid, w in unhooked.items() if expired(w, now)]:
        del unhooked[pid]
    for path in [path for path, w in by_path.items() if expired(w, now)]:
        worker = by_path.pop(path)
        worker.close()
        if worker.found is not None:
            beaconfiles.remove(worker.found)
