"""A fleet split into shards (docs/design.md, "Beyond one coordinator"): two coordinators, each
with the agents of its own nodes and the jobs that run there, real torchrun jobs, real agents,
real gRPC on loopback, every daemon at its defaults. Each shard names its own job's hang and
never hears of the other's; `watchdog status` given both shards lists every job, and still
answers with one shard down. Shards that share one PostgreSQL history (a real server,
tests/helpers/postgres.py): `incidents list` and the web view of either show both hangs, each
with the coordinator that stored it, and a hang reported while the server is stopped is
printed, spilled and stored once it is back; the password never shows."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import postgres as pg
from tests.helpers.daemons import status
from tests.helpers.harness import WATCHDOG, job_env, stop_process
from watchdog.cli.demo import TRAIN_SCRIPT, free_port

DEADLINE_S = 150


class Shard:
    """One coordinator, one agent (its node) and one 2-rank torchrun job on that node."""

    def __init__(self, tmp_path: Path, name: str, coordinator_args: tuple[str, ...] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.job_id = f"shard-{name}-{uuid.uuid4().hex[:8]}"
        self.address = f"127.0.0.1:{free_port()}"
        self.env = {**job_env(self.dir), "WATCHDOG_JOB_ID": self.job_id,
                    "STATE_DIRECTORY": str(self.dir / "state"), **(env or {})}
        self.procs: list[subprocess.Popen[str]] = []
        self._spawn([*WATCHDOG, "coordinator", "--listen", self.address,
                     *(("--db", str(self.dir / "incidents.db")) if coordinator_args is None
                       else coordinator_args)])
        self._spawn([*WATCHDOG, "agent", "--coordinator", self.address, "--node-name",
                     f"node-{name}"])

    def _spawn(self, args: list[str]) -> None:
        env = self.env
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


def verdict_of(shard: Shard) -> dict[str, Any]:
    _until(lambda: (shard.jobs().get(shard.job_id) or {}).get("verdict") is not None)
    verdict: dict[str, Any] = shard.jobs()[shard.job_id]["verdict"]
    return verdict


def listed(shard: Shard, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WATCHDOG, "incidents", "list", *args], env=shard.env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.long_job
def test_shards_on_one_postgresql_share_one_history_through_an_outage(
        postgres: pg.Cluster, tmp_path: Path) -> None:
    url = postgres.database(user=pg.PASSWORD_USER)
    with_password = url.replace("@", f":{pg.PASSWORD}@", 1)
    web = f"127.0.0.1:{free_port()}"
    # One names the server on its command line (the password from a password file), the other
    # in $WATCHDOG_DB with the password in it.
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:{pg.PASSWORD_USER}:{pg.PASSWORD}\n")
    passfile.chmod(0o600)
    made: list[Shard] = []
    try:
        made.append(Shard(tmp_path, "a", ("--db", url, "--web-listen", web),
                          env={"PGPASSFILE": str(passfile)}))
        made.append(Shard(tmp_path, "b", (), env={"WATCHDOG_DB": with_password}))
        a, b = made
        a.start_job("--fault", "data_stall", "--fault-rank", "1", "--fault-step", "4")
        first = verdict_of(a)
        _until(lambda: first["id"] in listed(a, "--json", "--db", url).stdout)
        postgres.stop()
        try:
            b.start_job("--fault", "data_stall", "--fault-rank", "0", "--fault-step", "4")
            refused = verdict_of(b)  # told while the server is down
            _until(lambda: any((b.dir / "state").glob("pg-*.pending")))
            (spill,) = (b.dir / "state").glob("pg-*.pending")
        finally:
            postgres.start()
        _until(lambda: not spill.exists())  # b's retry stored it
        # As each knows the database: a by --db, b by its environment.
        table = [listed(a, "--db", url), listed(b)]
        listed_json = [listed(a, "--json", "--db", url), listed(b, "--json")]
        with urllib.request.urlopen(f"http://{web}/", timeout=20) as page:
            html = page.read().decode()
    finally:
        logs = [shard.stop() for shard in made]
        print("\n===\n".join(logs))
    host = socket.gethostname().split(".")[0]
    names = {first["id"]: f"{host}:{a.address.rsplit(':')[1]}",
             refused["id"]: f"{host}:{b.address.rsplit(':')[1]}"}
    for out in listed_json:
        assert out.returncode == 0, out.stderr
        assert {i["id"]: i for i in json.loads(out.stdout)} == {
            first["id"]: first, refused["id"]: refused}  # the incident JSON, as reported
    for out in table:
        for incident_id, name in names.items():
            assert re.search(rf"^{incident_id} .* {re.escape(name)} ", out.stdout, re.M), out.stdout
    for incident_id, name in names.items():
        assert incident_id in html and f'<td class="mono">{name}</td>' in html
    assert f" incident {refused['id']}: " in logs[1]
    assert f"cannot store incidents in {url.replace('@', ':***@', 1)}: " in logs[1]
    assert pg.PASSWORD not in "".join(logs + [o.stdout + o.stderr for o in table + listed_json])
    assert spill.name == (f"pg-{pg.PASSWORD_USER}@127.0.0.1-{postgres.port}-"
                          f"{pg.dbname(url)}.pending")
