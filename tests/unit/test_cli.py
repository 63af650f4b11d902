"""The command line's own contract, in this process: version, usage errors, exit codes."""

from __future__ import annotations

import pytest

from watchdog import __version__
from watchdog.cli import main
from watchdog.cli.command import Command
from watchdog.cli.main import COMMANDS, DAEMONS
from watchdog.errors import ExitCode


def exit_code_and_stderr(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ended:
        main(argv)
    return int(ended.value.code or 0), capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out == f"watchdog {__version__}\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--stall-timeout", "-1", "--", "true"],
     "argument --stall-timeout: must be a positive number of seconds, not -1"),
    (["run", "--stall-floor", "0", "--", "true"],
     "argument --stall-floor: must be a positive number of seconds, not 0"),
    (["coordinator", "--stall-k", "nan"], "argument --stall-k: must be a positive number"),
    (["coordinator", "--keep", "2.5"], "argument --keep: not a whole number: '2.5'"),
    (["coordinator", "--keep-days", "soon"], "argument --keep-days: not a number: 'soon'"),
    (["agent", "--interval", "inf"], "argument --interval: must be a positive number"),
])
def test_bad_numbers_are_usage_errors_naming_the_option(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_code_and_stderr(argv, capsys)
    assert code == ExitCode.USAGE
    assert message in err


def test_a_watchdog_error_exits_1_with_its_hint(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: object) -> None:
    assert main(["incidents", "show", "--db", f"{tmp_path}/none.db"]) == ExitCode.USAGE
    assert main(["incidents", "show", "nope", "--db", f"{tmp_path}/none.db"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "incidents show needs an incident id" in err
    assert "hint: `watchdog incidents list` shows them" in err
    assert "no incident nope in" in err


def test_run_without_a_command_says_how_to_pass_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == ExitCode.USAGE
    assert "hint: put the job after --" in capsys.readouterr().err


def test_help_lists_each_subcommand_once_and_the_daemons_log_by_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    names = ["run", "launch", "demo", "agent", "coordinator", "status", "incidents", "explain",
             "doctor", "check"]
    assert [command.name for command in COMMANDS] == names
    with pytest.raises(SystemExit):
        main(["--help"])
    # A subcommand's line is indented by four; a help wrapped onto the next line, by more.
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
              if line.startswith("    ") and not line.startswith("     ")]
    assert listed == names
    assert DAEMONS == ("agent", "coordinator")


def help_of(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([name, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_each_subcommand_says_what_it_does_with_an_example(
        command: Command, capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(command.name, capsys)
    first = " ".join(command.description.split()[:4])
    assert first in " ".join(text.split()), text
    assert f"example:\n  {command.example}\n" in text
    assert command.example.startswith(("watchdog ", "torchrun ")), command.name


def test_help_shows_defaults_and_what_each_option_is(capsys: pytest.CaptureFixture[str]) -> None:
    coordinator = " ".join(help_of("coordinator", capsys).split())
    assert "--listen HOST:PORT serve gRPC (agents, `watchdog status`) on HOST:PORT (default: " \
           "127.0.0.1:29450)" in coordinator
    assert "~/.local/state/torch-hang-watchdog/incidents.db for other users" in coordinator
    assert "--stall-floor S adaptive threshold never below S seconds (default 10)" in coordinator
    for name in ("status", "incidents", "explain"):
        text = " ".join(help_of(name, capsys).split())
        assert "--json " in text and "--json --" not in text, text  # a help text follows
    run = " ".join(help_of("run", capsys).split())
    assert "(default: report)" in run
    assert "--stall- floor" not in run  # an option named in a help stays whole


def test_an_unknown_option_gets_its_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_code_and_stderr(["run", "--bogus", "--", "true"], capsys)
    assert code == ExitCode.USAGE
    assert err.startswith("usage: watchdog run ")
    assert "watchdog run: error: unrecognized arguments: --bogus" in err
    assert "hint: `watchdog run --help` says what it takes" in err
