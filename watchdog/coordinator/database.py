"""What `--db` (or $WATCHDOG_DB) names (CLI and coordinator process): a SQLite file, the default,
or a PostgreSQL server by a `postgresql://` URL, which several coordinators share. Read before a
command starts anything, so a value that is neither is a usage error, and shown everywhere
with its password masked.

A password on the command line is refused, not warned about: `ps` shows every process's
arguments to every user, and the shell keeps them in its history, before any warning could be
read. libpq takes it from a password file (~/.pgpass, $PGPASSFILE) or $PGPASSWORD; a URL in
$WATCHDOG_DB may hold it (a process's environment is its user's and root's alone)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from watchdog.errors import UsageError

DB_ENV = "WATCHDOG_DB"
SQLITE = "sqlite"
POSTGRES = "postgresql"
MASK = "***"
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_POSTGRES_SCHEMES = ("postgresql", "postgres")  # libpq takes both
_URL_HINT = ("e.g. postgresql://watchdog@db.example:5432/incidents?sslmode=verify-full, with "
             "the password in ~/.pgpass, $PGPASSFILE or $PGPASSWORD")


@dataclass(frozen=True)
class Database:
    kind: str  # SQLITE or POSTGRES
    target: str = field(repr=False)  # the path, or the URL as given: it may hold a password
    shown: str  # what is printed and logged: the URL with its password masked

    def __str__(self) -> str:
        return self.shown


def state_dir() -> str:
    """The coordinator's own directory: systemd's $STATE_DIRECTORY in a unit that has one (a
    dynamic user has no home), else a system path for root and the user's state directory
    otherwise."""
    given = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if given:
        return given
    if os.geteuid() == 0:
        return "/var/lib/torch-hang-watchdog"
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "torch-hang-watchdog")


def default_db_path() -> str:
    return os.path.join(state_dir(), "incidents.db")


def database_of(given: str | None) -> Database:
    """The database `--db` names (`given`: a password in it is refused), else $WATCHDOG_DB's,
    else the default file; UsageError, with a hint, for a value that is neither a usable path
    nor a supported URL."""
    if given is not None:
        return parse(given, "--db", password_allowed=False)
    from_env = os.environ.get(DB_ENV)
    if from_env:
        return parse(from_env, f"${DB_ENV}", password_allowed=True)
    return Database(SQLITE, default_db_path(), default_db_path())


def parse(text: str, source: str, password_allowed: bool) -> Database:
    scheme = _SCHEME.match(text.strip())
    if scheme is None:
        return Database(SQLITE, _usable_path(text, source), text)
    text = text.strip()  # a URL read from a file (a Kubernetes Secret) ends in a newline
    if scheme.group(1).lower() not in _POSTGRES_SCHEMES:
        raise UsageError(f"{source} {mask(text)}: not a SQLite file path nor a postgresql:// "
                         "URL", hint=f"give a file path (e.g. ./incidents.db), or {_URL_HINT}")
    params = _postgres_params(text, source)
    if "password" in params and not password_allowed:
        raise UsageError(f"{source} {mask(text)}: a password on the command line is seen by "
                         "every user (ps) and kept in the shell's history",
                         hint="put it in a password file (~/.pgpass, or $PGPASSFILE) or in "
                              f"$PGPASSWORD, or give the whole URL in ${DB_ENV}")
    return Database(POSTGRES, text, mask(text))


def mask(url: str) -> str:
    """`url` with its password, in the user part or a `password=` parameter, as ***; a URL it
    cannot mask for sure is shown as its scheme alone."""
    head, sep, rest = url.partition("://")
    user_part = _user_part(rest)
    if user_part is not None and ":" in user_part:
        rest = f"{user_part.partition(':')[0]}:{MASK}{rest[len(user_part):]}"
    shown = head + sep + re.sub(r"([?&]password=)[^&]*", rf"\g<1>{MASK}", rest)
    return f"{head}{sep}{MASK}" if _leaks(shown, url) else shown


def _user_part(rest: str) -> str | None:
    """USER[:PASSWORD] of what follows `scheme://`, read as libpq does: up to the first '@'
    before any '/'."""
    end = min((i for i in (rest.find("@"), rest.find("/")) if i >= 0), default=len(rest))
    return rest[:end] if end < len(rest) and rest[end] == "@" else None


def _leaks(text: str, url: str) -> bool:
    """Whether what follows the scheme in `text` holds a password of `url`, as written or
    decoded."""
    rest = url.partition("://")[2]
    secrets = [(_user_part(rest) or "").partition(":")[2],
               *re.findall(r"[?&]password=([^&]*)", rest)]
    after = text.partition("://")[2]
    return any(secret and (secret in after or unquote(secret) in after) for secret in secrets)


def _postgres_params(url: str, source: str) -> dict[str, str]:
    """The URL's parameters as libpq reads them; UsageError when it does not, or when psycopg
    (the postgres extra) is not installed."""
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise UsageError(f"{source} {mask(url)}: PostgreSQL needs the postgres extra, which is "
                         "not installed here",
                         hint="pip install 'torch-hang-watchdog[postgres]' (psycopg 3) in this "
                              "environment") from None
    try:
        params = {key: str(value) for key, value in conninfo_to_dict(url).items()}
    except psycopg.Error as e:
        # libpq quotes the URL it refuses, password and all.
        reason = str(e).strip().splitlines()[0].replace(url, mask(url))
        said = "" if _leaks(reason, url) else f": {reason}"
        raise UsageError(f"{source} {mask(url)}: not a postgresql:// URL libpq reads{said}",
                         hint=_URL_HINT) from None
    ports = [port for port in params.get("port", "").split(",") if port]
    if not all(port.isdigit() for port in ports):
        raise UsageError(f"{source} {mask(url)}: the port is not a number", hint=_URL_HINT)
    return params


def _usable_path(path: str, source: str) -> str:
    """A path SQLite can make or open a file at, checked before anything starts (a directory
    given as the database once made the machine's root 0600)."""
    if not path:
        raise UsageError(f"{source} is empty",
                         hint=f"give a file path (e.g. ./incidents.db), or {_URL_HINT}")
    if os.path.isdir(path) or path.endswith(os.sep):
        raise UsageError(f"{source} {path} is a directory",
                         hint=f"give a file path in it, e.g. {os.path.join(path, 'incidents.db')}")
    parent = os.path.dirname(path)
    if parent and os.path.exists(parent) and not os.path.isdir(parent):
        raise UsageError(f"{source} {path}: {parent} is not a directory",
                         hint="give a file path in a directory, e.g. ./incidents.db")
    return path
