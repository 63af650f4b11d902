"""Issue 20, finding 6, links planted where root writes a report: root runs a job under
`watchdog run --report PATH --report-html PATH` and then `incidents show --html PATH`, each PATH
in a directory every user may write in (sticky, like /tmp), on a machine whose kernel follows
any link there (fs.protected_symlinks=0). `nobody` planted links to a file of root's at the names
the reports were once written under first (PATH.tmp), and at one PATH itself; root's file is
untouched, and each report is a file of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.attack import AS_NOBODY, WATCHDOG, clean_env, scratch_dir
from tests.helpers.daemons import HANG_AFTER_3_STEPS
from watchdog.cli.demo import free_port

PROTECTED_SYMLINKS = Path("/proc/sys/fs/protected_symlinks")
ROOTS_OWN = "root's own file, which no report may overwrite\n"


@pytest.fixture
def links_followed_anywhere() -> Iterator[None]:
    """fs.protected_symlinks=0 for the test (the kernel's protection would hide the bug), as it
    was afterwards."""
    try:
        before = PROTECTED_SYMLINKS.read_text()
        PROTECTED_SYMLINKS.write_text("0\n")
    except OSError as e:
        pytest.fail(f"this test needs to set {PROTECTED_SYMLINKS} to 0 (as root, with /proc/sys "
                    f"writable): {e}")
    try:
        yield
    finally:
        PROTECTED_SYMLINKS.write_text(before)


def plant(link: Path, target: Path) -> None:
    subprocess.run([*AS_NOBODY, "ln", "-s", str(target), str(link)], check=True, cwd="/")


def test_reports_never_follow_a_link_planted_in_a_shared_directory(
        tmp_path: Path, links_followed_anywhere: None) -> None:
    precious = tmp_path / "precious"
    precious.write_text(ROOTS_OWN)
    with scratch_dir() as shared:
        report, page, shown = shared / "hang.json", shared / "hang.html", shared / "shown.html"
        for name in (report, page, shown):
            plant(Path(f"{name}.tmp"), precious)
        plant(page, precious)  # at the report's own name: replaced, not written through
        run = subprocess.run(
            [*WATCHDOG, "run", "--stall-timeout", "2", "--on-hang", "kill",
             "--db", str(tmp_path / "incidents.db"), "--report", str(report),
             "--report-html", str(page), "--", sys.executable, "-c", HANG_AFTER_3_STEPS],
            capture_output=True, text=True, timeout=180, cwd="/",
            env=clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port())))
        assert run.returncode == 3, run.stderr
        assert precious.read_text() == ROOTS_OWN, "--report or --report-html wrote through a link"
        incident = json.loads(report.read_text())
        show = subprocess.run([*WATCHDOG, "incidents", "show", incident["id"], "--db",
                               str(tmp_path / "incidents.db"), "--html", str(shown)],
                              capture_output=True, text=True, timeout=60, cwd="/", env=clean_env())
        assert show.returncode == 0, show.stderr
        assert precious.read_text() == ROOTS_OWN, "incidents show --html wrote through a link"
        for written in (report, page, shown):
            assert not written.is_symlink() and written.stat().st_uid == 0
            assert written.stat().st_mode & 0o777 == 0o600
        assert incident["id"] in page.read_text() and incident["id"] in shown.read_text()


# Root's `watchdog check` as if its pid were foreseen: `nobody` plants the link at the name of
# its job log, then the same process (the same pid) becomes `watchdog check`.
FORESEEN = """
import json, os, subprocess, sys
shared, target, as_nobody = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
link = os.path.join(shared, f"watchdog-check-{os.getpid()}.log")
subprocess.run([*as_nobody, "ln", "-s", target, link], check=True)
os.execv(sys.executable, [sys.executable, "-m", "watchdog", "check", "--nproc", "1", "--db",
                          os.path.join(shared, "incidents.db"), "--", "--no-such-flag"])
"""


def test_check_never_writes_its_job_log_through_a_planted_link(
        tmp_path: Path, links_followed_anywhere: None) -> None:
    precious = tmp_path / "precious"
    precious.write_text(ROOTS_OWN)
    with scratch_dir() as shared:
        check = subprocess.run([sys.executable, "-c", FORESEEN, str(shared), str(precious),
                                json.dumps(AS_NOBODY)], capture_output=True, text=True,
                               timeout=120, cwd="/", env=clean_env(TMPDIR=str(shared)))
    assert "the job's output goes to" in check.stdout, check.stdout + check.stderr
    assert precious.read_text() == ROOTS_OWN, "check wrote its job log through a link"
