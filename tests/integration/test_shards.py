"""A fleet split into shards (docs/design.md, "Beyond one coordinator"): two coordinators, each
with the agents of its own nodes and the jobs that run there, real torchrun jobs, real agents,
real gRPC on loopback, every daemon at its defaults. Each shard names its own job's hang and
never hears of the other's; `watchdog status` given both shards lists every job, and still
answers with one shard down."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemons import status
from tests.helpers.harness import WATCHDOG, job_env, stop_process
from watchdog.cli.demo import TRAIN_SCRIPT, free_port

DEADLINE_S = 150


class Shard:
    """One coordinator, one agent (its node) and one 2-rank torchrun job on that node."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.job_id = f"shard-{name}-{uuid.uuid4().hex[:8]}"
        self.address = f"127.0.0.1:{free_port()}"
        self.procs: list[subprocess.Popen[str]] = []
        self._spawn([*WATCHDOG, "coordinator", "--listen", self.address,
                     "--db", str(self.dir / "incidents.db")])
        self._spawn([*WATCHDOG, "agent", "--coordinator", self.address, "--node-name",
                     f"node-{name}"])

    def _spawn(self, args: list[str]) -> None:
        env = {**job_env(self.dir), "WATCHDOG_JOB_ID": self.job_id}
        self.procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True,
                                           start_new_session=True))

    def start_job(self, *train_args: str) -> None:
        self._spawn([*WATCHDOG, "launch", "--", sys.executable, "-m", "torch.distributed.run",
                     "--nproc_per_node=2", f"--master_port={free_port()}", TRAIN_SCRIPT,
                     *train_args])

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {job["job_id"]: job for job in (status(self.address) or {"jobs": []})["jobs"]}

    def stop(self) -> str:
        return "\n---\n".join(stop_process(proc) for proc in reversed(self.procs))


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[tuple[Shard, Shard]]:
    made: list[Shard] = []
    try:
        made += [Shard(tmp_path, "a"), Shard(tmp_path, "b")]
        yield made[0], made[1]
    finally:
        for shard in made:
            print(shard.stop())


def _until(predicate: Any) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(1)


def _status(*addresses: str) -> subprocess.CompletedProcess[str]:
    flags = [flag for address in addresses for flag in ("--coordinator", address)]
    return subprocess.run([*WATCHDOG, "status", *flags, "--json"], capture_output=True,
                          text=True, timeout=60)


def test_each_shard_names_its_own_jobs_hang_and_status_asks_them_all(
        shards: tuple[Shard, Shard]) -> None:
    a, b = shards
    a.start_job("--fault", "data_stall", "--fault-rank", "1", "--fault-step", "4")
    b.start_job("--steps", "100000")
    _until(lambda: (a.jobs().get(a.job_id) or {}).get("verdict") is not None
           and b.job_id in b.jobs())
    verdict = a.jobs()[a.job_id]["verdict"]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("MISSING_RANKS", [1])
    assert "read_sample_from_storage" in [
        f["function"] for r in verdict["ranks"] if r["rank"] == 1 for f in r["stack"]]
    assert a.job_id not in b.jobs() and b.job_id not in a.jobs(), "a job reported to one shard"
    assert b.jobs()[b.job_id]["verdict"] is None

    both = _status(a.address, b.address)
    assert both.returncode == 0, both.stderr
    listed = {job["job_id"]: job for job in json.loads(both.stdout)["jobs"]}
    assert {a.job_id, b.job_id} <= listed.keys()
    assert listed[a.job_id]["verdict"]["culprit_ranks"] == [1]

    down = f"127.0.0.1:{free_port()}"
    one = _status(a.address, down)
    assert one.returncode == 0 and f"skipped coordinator at {down}" in one.stderr
    assert a.job_id in {job["job_id"] for job in json.loads(one.stdout)["jobs"]}
    none = _status(down, f"127.0.0.1:{free_port()}")
    assert none.returncode != 0 and "no coordinator answered" in none.stderr
