"""Every subcommand given bad input (a missing file, a directory for a file, a bad or unknown
option, a bad value, an unreachable coordinator, a command that cannot start) answers with one
line and a hint, exit 2 for usage and 1 for a failure: never a traceback. In this process, as
`watchdog` runs: the real parser, the real commands, nothing started but what they start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from watchdog.cli import main
from watchdog.cli.main import COMMANDS
from watchdog.errors import ExitCode

MISSING = "missing/file"  # under the test's own directory, its working directory here
# A directory wherever a file is wanted: the test's own (a command that mistook "/" for its
# database once made the machine's root 0600), whose mode nothing may change.
DIRECTORY = "./a-directory"
UNREACHABLE = "127.0.0.1:1"  # refused at once: nothing listens on port 1
SECRET = "hunter2"  # a password that must never be printed
WITH_PASSWORD = f"postgresql://watchdog:{SECRET}@db.example/incidents"
NO_SERVER = "postgresql://nobody@127.0.0.1:1/incidents"

USAGE, ERROR = ExitCode.USAGE, ExitCode.ERROR
WALK: list[tuple[list[str], int]] = [
    (["run", "--", MISSING], USAGE),
    (["run", "--", DIRECTORY], USAGE),
    (["run", "--report", DIRECTORY, "--", "true"], USAGE),
    (["run", "--report", f"{MISSING}/report.json", "--", "true"], USAGE),
    (["run", "--report-html", f"{MISSING}/report.html", "--", "true"], USAGE),
    (["run", "--on-hang", "never", "--", "true"], USAGE),
    (["run", "--stall-timeout", "soon", "--", "true"], USAGE),
    (["run", "--bogus", "--", "true"], USAGE),
    (["run"], USAGE),
    (["run", "--db", "mysql://watchdog@db.example/incidents", "--", "true"], USAGE),
    (["run", "--db", DIRECTORY, "--", "true"], USAGE),
    (["launch", "--", MISSING], USAGE),
    (["launch", "--", DIRECTORY], USAGE),
    (["launch", "--bogus", "--", "true"], USAGE),
    (["demo", "--bogus"], USAGE),
    (["demo", "--db", "sqlite:///incidents.db"], USAGE),
    (["agent", "--coordinator", "nohost:port"], USAGE),
    (["agent", "--beacon-dir", __file__], USAGE),
    (["agent", "--token-file", MISSING], USAGE),
    (["agent", "--interval", "0"], USAGE),
    (["agent", "--bogus"], USAGE),
    (["coordinator", "--listen", "127.0.0.1:port"], USAGE),
    (["coordinator", "--db", DIRECTORY, "--listen", "127.0.0.1:0"], USAGE),
    (["coordinator", "--db", WITH_PASSWORD, "--listen", "127.0.0.1:0"], USAGE),
    (["coordinator", "--db", "postgresql://db.example:port/incidents"], USAGE),
    (["coordinator", "--token-file", MISSING], USAGE),
    (["coordinator", "--tls-cert", MISSING, "--tls-key", MISSING], USAGE),
    (["coordinator", "--bogus"], USAGE),
    (["status", "--coordinator", UNREACHABLE], ERROR),
    (["status", "--token-file", MISSING], USAGE),
    (["status", "--coordinator", UNREACHABLE, "--tls-ca", MISSING], USAGE),
    (["status", "--bogus"], USAGE),
    (["status", "--ranks", "9-2"], USAGE),
    (["status", "--ranks", "0-99999"], USAGE),
    (["incidents", "show"], USAGE),
    (["incidents", "show", "nope", "--db", "incidents.db"], ERROR),
    (["incidents", "list", "--db", DIRECTORY], USAGE),
    (["incidents", "list", "--db", f"postgresql://watchdog:{SECRET}@[::1"], USAGE),
    (["incidents", "list", "--db", f"{NO_SERVER}?sslmode=disable"], ERROR),
    (["incidents", "list", "--db", ""], USAGE),
    (["incidents", "show", "nope", "--html", DIRECTORY], USAGE),
    (["incidents", "list", "--html", "page.html"], USAGE),
    (["incidents", "forget"], USAGE),
    (["explain", MISSING], ERROR),
    (["explain", DIRECTORY], ERROR),
    (["explain", "--bogus"], USAGE),
    (["doctor", "--bogus"], USAGE),
    (["check", "--nproc", "two"], USAGE),
    (["check", "--backend", "mpi"], USAGE),
    (["check", "--bogus"], USAGE),
    (["check", "--db", "missing/file/"], USAGE),
    (["bogus"], USAGE),
]


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own exit, after its message
        return int(e.code or 0)


@pytest.mark.parametrize(("argv", "expected"), WALK, ids=[" ".join(a) for a, _ in WALK])
def test_bad_input_is_one_line_and_a_hint(argv: list[str], expected: int, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_DB", str(tmp_path / "incidents.db"))
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / DIRECTORY
    directory.mkdir(mode=0o755)
    code = exit_code(argv)
    captured = capsys.readouterr()
    assert directory.stat().st_mode & 0o777 == 0o755, "a directory given as a file is left alone"
    assert code == expected, captured.err
    assert "Traceback" not in captured.err + captured.out
    errors = [line for line in captured.err.splitlines()
              if line.startswith(("watchdog", "  hint: "))]
    assert errors[0].startswith("watchdog"), captured.err
    assert errors[-1].startswith("  hint: "), captured.err
    assert captured.out == "", "a failure says so on stderr alone"
    assert SECRET not in captured.err, "a password is never printed"


@pytest.mark.parametrize("value", [WITH_PASSWORD.replace("postgresql", "mysql"), "postgresql://[x",
                                   "./"])
def test_a_bad_database_in_the_environment_is_a_usage_error(
        value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_DB", value)
    assert exit_code(["incidents", "list"]) == USAGE
    err = capsys.readouterr().err
    assert err.startswith("watchdog: $WATCHDOG_DB ") and "\n  hint: " in err
    assert SECRET not in err


def test_postgresql_without_the_extra_is_a_usage_error_that_says_how_to_install_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` fails, as uninstalled
    assert exit_code(["incidents", "list", "--db", NO_SERVER]) == USAGE
    err = capsys.readouterr().err
    assert "PostgreSQL needs the postgres extra" in err
    assert "hint: pip install 'torch-hang-watchdog[postgres]'" in err


def test_the_walk_visits_every_subcommand() -> None:
    assert {argv[0] for argv, _ in WALK} >= {command.name for command in COMMANDS}


def test_status_with_nothing_running_is_an_empty_list_and_a_missing_job_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripts read `{"jobs": []}` when nothing runs (exit 0, the note on stderr); a job asked
    for by --job that is not there is exit 1."""
    # No `watchdog run` here (the machine's other runs are not this test's), no service.
    monkeypatch.setattr("watchdog.supervise.runs_dir.candidate_dirs", lambda: [])
    monkeypatch.setattr("watchdog.cli.status._listening", lambda address: False)
    assert exit_code(["status", "--json"]) == ExitCode.OK
    captured = capsys.readouterr()
    assert captured.out == '{"jobs": []}\n'
    assert captured.err.startswith("watchdog status: no job to show")
    assert exit_code(["status", "--job", "NOSUCH"]) == ExitCode.ERROR
    assert capsys.readouterr().err.endswith("watchdog status: no job NOSUCH here\n")


def test_help_and_usage_errors_name_no_internals(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["status", "--help"]) == ExitCode.OK
    assert "(default: )" not in capsys.readouterr().out
    assert exit_code(["incidents", "shw"]) == USAGE
    err = capsys.readouterr().err
    assert "argument action" not in err and "invalid choice: 'shw'" in err
