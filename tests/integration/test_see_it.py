"""One real hang, kept running, seen the ways a user sees it: `watchdog status` with no flags
from another process (it finds the `watchdog run` by itself), and the HTML report in a real
headless Chromium (default settings: no XDG_RUNTIME_DIR, the runs directory under /tmp)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import everyone
from tests.helpers.browser import screenshot
from tests.helpers.harness import WATCHDOG, job_env, stop_process
from watchdog.cli.demo import torchrun_command

DIAGNOSIS_DEADLINE_S = 120


@dataclass
class HungRun:
    proc: subprocess.Popen[str]
    job_id: str
    env: dict[str, str]
    report: Path
    html: Path
    tmp: Path
    output: str = ""

    @property
    def incident(self) -> dict[str, Any]:
        return dict(json.loads(self.report.read_text()))

    @property
    def socket(self) -> Path:
        return Path(f"/tmp/torch-hang-watchdog-{os.geteuid()}/run-{self.proc.pid}.sock")

    def stop(self) -> None:
        if self.proc.returncode is None:
            self.output = stop_process(self.proc)


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HungRun]:
    """`watchdog run --on-hang report`: rank 2 blocks reading data at step 4, the job stays."""
    tmp = tmp_path_factory.mktemp("hung")
    job_id = f"see-it-{uuid.uuid4().hex[:8]}"
    env = {**job_env(tmp), "WATCHDOG_JOB_ID": job_id}
    env.pop("XDG_RUNTIME_DIR", None)
    run = HungRun(subprocess.Popen(
        [*WATCHDOG, "run", "--stall-timeout", "3", "--on-hang", "report", "--report",
         str(tmp / "incident.json"), "--report-html", str(tmp / "incident.html"), "--",
         *torchrun_command(4, "--fault", "data_stall", "--fault-rank", "2", "--fault-step", "4")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        job_id, env, tmp / "incident.json", tmp / "incident.html", tmp)
    try:
        deadline = time.monotonic() + DIAGNOSIS_DEADLINE_S
        while not (run.html.exists() and run.report.exists()):
            assert run.proc.poll() is None, f"watchdog run ended:\n{stop_process(run.proc)}"
            assert time.monotonic() < deadline, f"no incident:\n{stop_process(run.proc)}"
            time.sleep(0.5)
        yield run
    finally:
        run.stop()
        print(run.output)


def status(run: HungRun, *flags: str) -> subprocess.CompletedProcess[str]:
    """`watchdog status` from another process, with the user's own environment."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    return subprocess.run([*WATCHDOG, "status", *flags], capture_output=True, text=True,
                          timeout=60, env=env)


def test_status_with_no_flags_finds_the_running_job(hung_run: HungRun) -> None:
    human = status(hung_run)
    assert human.returncode == 0, human.stderr
    ours = human.stdout.split(f"== watchdog run, pid {hung_run.proc.pid}, user ")[1]
    assert f"job {hung_run.job_id}  HUNG  world size 4" in ours
    assert "*2 " in ours  # the culprit's row is marked
    assert "MISSING_RANKS: rank 2 (stuck in read_sample_from_storage at train.py:" in ours

    as_json = status(hung_run, "--json")
    assert as_json.returncode == 0, as_json.stderr
    jobs = json.loads(as_json.stdout)["jobs"]
    (job,) = [j for j in jobs if j["job_id"] == hung_run.job_id]
    assert job["state"] == "HUNG"
    assert sorted(r["rank"] for r in job["ranks"]) == [0, 1, 2, 3]
    assert job["verdict"]["id"] == hung_run.incident["id"]
    assert job["verdict"]["culprit_ranks"] == [2]
    # the contract's keys, and beside them the job's attempt, groups of ranks alike, warnings,
    # flagged ranks (none here: 4 ranks are each listed in full) and its slowest rank
    assert set(job) == {"job_id", "attempt", "state", "world_size", "nodes", "ranks",
                        "rank_groups", "verdict", "findings", "flagged", "slowest"}
    assert (job["attempt"], job["rank_groups"], job["findings"], job["flagged"]) == (0, [], [],
                                                                                    [])


def test_a_run_that_does_not_answer_is_skipped_with_a_note(hung_run: HungRun) -> None:
    """A socket that takes connections and drops them, as a wedged run's would."""
    path = hung_run.socket.with_name(f"run-{os.getpid()}.sock")

    def drop_every_connection(listener: socket.socket) -> None:
        with contextlib.suppress(OSError):  # until the listener is shut down
            while True:
                listener.accept()[0].close()

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(str(path))
        mute.listen()
        dropper = threading.Thread(target=drop_every_connection, args=(mute,), daemon=True)
        dropper.start()
        try:
            out = status(hung_run, "--json")
        finally:
            path.unlink()
            mute.shutdown(socket.SHUT_RDWR)
            dropper.join(5)
    assert out.returncode == 0, out.stderr
    assert f"watchdog status: skipped watchdog run, pid {os.getpid()}, user " in out.stderr
    assert hung_run.job_id in [job["job_id"] for job in json.loads(out.stdout)["jobs"]]


def test_html_report_of_a_real_hang_in_chromium(hung_run: HungRun, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(hung_run.html.as_uri())
    assert requests == [hung_run.html.as_uri()]  # self-contained: nothing else is fetched

    assert page.locator("h1").inner_text().startswith("MISSING_RANKS")
    sentence = page.locator(".verdict .sentence").inner_text()
    assert sentence.startswith("rank 2 (stuck in read_sample_from_storage at train.py:")
    assert "ranks 0,1,3 wait there since" in sentence

    # The merged stacks: a trunk all four share, then the split, the culprit's side first.
    tree = page.locator(".tree")
    assert tree.locator(":scope > .who").inner_text() == "all 4 ranks"
    assert "<module>" in tree.locator(":scope > .frames").first.inner_text()
    sides = tree.locator(".split > .branch")
    assert sides.count() == 2
    assert sides.nth(0).get_attribute("data-ranks") == "rank 2"
    assert "culprit" in (sides.nth(0).get_attribute("class") or "")
    assert "read_sample_from_storage" in sides.nth(0).locator(".leaf").inner_text()
    assert sides.nth(1).get_attribute("data-ranks") == "ranks 0,1,3"
    assert "read_sample_from_storage" not in sides.nth(1).inner_text()

    # The timeline: the culprit's lane first and marked, the waiters' lane after it.
    lanes = page.locator("svg.timeline g.lane")
    assert lanes.count() == 2
    assert lanes.nth(0).get_attribute("data-ranks") == "rank 2"
    assert lanes.nth(0).get_attribute("class") == "lane culprit"
    assert "STALLED after all_reduce #" in (lanes.nth(0).text_content() or "")
    assert lanes.nth(1).get_attribute("data-state") == "WAITING"
    box = lanes.nth(0).bounding_box()
    assert box is not None and box["width"] > 600 and box["height"] > 10  # drawn, not empty

    culprit_row = page.locator("table.groups tr.culprit")
    assert "rank 2" in culprit_row.inner_text() and "STALLED" in culprit_row.inner_text()
    screenshot(page, hung_run.tmp, "incident-report.png")
    page.close()


def test_incidents_show_html_writes_the_same_page(hung_run: HungRun) -> None:
    path = hung_run.tmp / "again.html"
    out = subprocess.run([*WATCHDOG, "incidents", "show", hung_run.incident["id"], "--html",
                          str(path)], env=hung_run.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert path.read_bytes() == hung_run.html.read_bytes()


def test_the_run_leaves_no_socket_behind(hung_run: HungRun) -> None:
    assert hung_run.socket.is_socket()
    hung_run.stop()
    assert not hung_run.socket.exists(), hung_run.output
    after = status(hung_run, "--json")
    assert hung_run.job_id not in after.stdout


def watchdog_as(user: str, *args: str) -> list[str]:
    """`watchdog ARGS` as `user`, from the copy every user may run."""
    return ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}",
            "--clear-groups", everyone.python(), "-m", "watchdog", *args]


def test_each_user_sees_their_own_runs_and_root_sees_everyones() -> None:
    """A `watchdog run` of the unprivileged user nobody, seen by nobody and by root, not by
    another user."""
    nobody = pwd.getpwnam("nobody")
    home = Path(tempfile.mkdtemp(prefix="watchdog-nobody-"))
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "WATCHDOG_DB": str(home / "i.db"),
           "WATCHDOG_BEACON_DIR": str(home / "beacons")}
    run = subprocess.Popen(watchdog_as("nobody", "run", "--", "sleep", "120"), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
    socket_path = Path(f"/tmp/torch-hang-watchdog-{nobody.pw_uid}/run-{run.pid}.sock")
    try:
        deadline = time.monotonic() + 60
        while not socket_path.is_socket():
            assert run.poll() is None and time.monotonic() < deadline, stop_process(run)
            time.sleep(0.1)
        header = f"== watchdog run, pid {run.pid}, user nobody\nno jobs"

        def status_as(*user: str) -> subprocess.CompletedProcess[str]:
            cmd = watchdog_as(*user, "status") if user else [*WATCHDOG, "status"]
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60,
                                  cwd="/")

        assert header in status_as("nobody").stdout
        assert header in status_as().stdout  # root
        other = status_as("daemon")
        assert f"pid {run.pid}" not in other.stdout + other.stderr
    finally:
        stop_process(run)
        shutil.rmtree(home, ignore_errors=True)
    assert not socket_path.exists()
