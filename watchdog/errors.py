"""Error types shared by every process, each with a hint that tells the user how to fix it, and
the exit codes the CLI maps them to."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What the `watchdog` command exits with; `run` otherwise exits with the job's own code."""

    OK = 0
    ERROR = 1  # a WatchdogError: its hint is printed
    USAGE = 2
    HANG_KILLED = 3  # `run --on-hang kill` detected a hang and ended the job
    INTERRUPTED = 130


class WatchdogError(Exception):
    """Root of every error this package raises on purpose."""

    hint: str = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    def __str__(self) -> str:
        message = super().__str__()
        return f"{message}\n  hint: {self.hint}" if self.hint else message


class UsageError(WatchdogError):
    """Bad command-line input or configuration."""


class BeaconError(WatchdogError):
    """A beacon file is missing, truncated, of another version, or keeps changing under us."""

    hint = ("the beacon may be from another torch-hang-watchdog version; "
            "restart the job with this one")


class PySpyMissingError(WatchdogError):
    """py-spy is not installed or not on PATH."""

    hint = "install it with `pip install py-spy` in the agent's environment"


class PtraceDeniedError(WatchdogError):
    """The kernel refused to let us attach to a worker."""

    hint = (
        "run the agent as the same user as the job with kernel.yama.ptrace_scope=0 "
        "(`sysctl kernel.yama.ptrace_scope=0`), or grant it CAP_SYS_PTRACE "
        "(systemd: AmbientCapabilities=CAP_SYS_PTRACE; Kubernetes: "
        "securityContext.capabilities.add [SYS_PTRACE] and shareProcessNamespace: true)"
    )


class CoordinatorUnreachableError(WatchdogError):
    """No coordinator answered at the given address."""

    hint = "start one with `watchdog coordinator`, or pass --coordinator HOST:PORT"


class MessageRejectedError(WatchdogError):
    """A gRPC message failed validation."""


class AuthError(WatchdogError):
    """The coordinator refused a call: the token was missing or wrong."""

    hint = "pass the coordinator's token with --token-file FILE (or $WATCHDOG_TOKEN)"


class StoreError(WatchdogError):
    """The incident database refused a read or a write, or could not be opened."""

    hint = ("check that --db (or $WATCHDOG_DB) names a database this user can write: a SQLite "
            "path, or a postgresql:// URL whose server answers")


class StoreUnavailableError(StoreError):
    """The incident database's server did not answer; it may come back (a coordinator keeps
    its incidents meanwhile and stores them then)."""

    hint = ("check that the PostgreSQL server is up and reachable, and the URL's user, host, "
            "port and database; the password comes from the password file (~/.pgpass, "
            "$PGPASSFILE) or $PGPASSWORD")


class SchemaTooNewError(StoreError):
    """The incident database was made or migrated by a newer torch-hang-watchdog."""

    hint = ("upgrade torch-hang-watchdog here to the release that the database's other "
            "coordinators run, or give --db another database")
