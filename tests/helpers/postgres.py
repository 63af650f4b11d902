"""A throwaway PostgreSQL server for the tests that store incidents there: `initdb` and `pg_ctl`
from this machine's server packages (Debian's `postgresql`, which tests/system-deps.sh
installs), as an unprivileged user (`nobody` when the tests run as root: the server refuses
root), in a temporary directory of its own, listening on a free loopback port with TLS (a
certificate of its own, `ca`). Everyone is trusted on loopback but `PASSWORD_USER`, who
gives a password; nothing is made durable (fsync off). Each test takes a database of its own
(`database`): creating one takes a few milliseconds."""

from __future__ import annotations

import contextlib
import datetime
import glob
import ipaddress
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from psycopg.conninfo import conninfo_to_dict

from watchdog.cli.demo import free_port

SUPERUSER = "postgres"
PASSWORD_USER = "watchdog_pw"  # the one role that must give its password (scram-sha-256)
PASSWORD = "s3cret-pw"
START_TIMEOUT_S = 60
_FIX = "install the PostgreSQL server (Debian: apt-get install postgresql; tests/system-deps.sh)"


def server_binary(name: str) -> str | None:
    """`initdb`, `pg_ctl`: on PATH, else where Debian's packages put them (newest first)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda path: int(Path(path).parts[-3]), reverse=True)
    return versions[0] if versions else None


def missing() -> str | None:
    """Why no cluster can start here, with the fix; None when one can."""
    absent = [name for name in ("initdb", "pg_ctl") if server_binary(name) is None]
    return f"no {' or '.join(absent)} on this machine: {_FIX}" if absent else None


class Cluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="watchdog-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.ca = str(self.dir / "server.crt")  # self-signed: its own CA
        self._as_owner: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "nobody", "nogroup")
            self._as_owner = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

    def make(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E",
                  "UTF8", "--no-sync")
        self._configure()
        self.start()
        with self.admin() as conn:
            conn.execute(f"CREATE ROLE {PASSWORD_USER} LOGIN CREATEDB PASSWORD '{PASSWORD}'")

    def _run(self, tool: str, *args: str) -> None:
        binary = server_binary(tool)
        assert binary is not None, _FIX
        out = subprocess.run([*self._as_owner, binary, *args], capture_output=True, text=True,
                             timeout=START_TIMEOUT_S, cwd=self.dir)
        assert out.returncode == 0, f"{tool} {' '.join(args)}: {out.stdout}{out.stderr}"

    def _configure(self) -> None:
        self._certificate()
        (self.data / "pg_hba.conf").write_text(
            f"local all all trust\nhost all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256\n"
            "host all all 127.0.0.1/32 trust\n")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.dir}'\nfsync = off\n"
                       "ssl = on\nssl_cert_file = '../server.crt'\n"
                       "ssl_key_file = '../server.key'\n")

    def _certificate(self) -> None:
        """A self-signed certificate for 127.0.0.1 and localhost; its key the server's own,
        0600, as the server demands."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "watchdog test postgres")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName([
                    x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                    critical=False)
                .sign(key, hashes.SHA256()))
        Path(self.ca).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file = self.dir / "server.key"
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        key_file.chmod(0o600)
        if self._as_owner:
            shutil.chown(key_file, "nobody", "nogroup")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w",
                  "-t", str(START_TIMEOUT_S), "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, dbname: str, user: str = SUPERUSER, query: str = "sslmode=disable") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}?{query}"

    @contextlib.contextmanager
    def admin(self, dbname: str = "postgres") -> Iterator[psycopg.Connection[tuple[object, ...]]]:
        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            yield conn

    def database(self, user: str = SUPERUSER) -> str:
        """A new, empty database that PASSWORD_USER owns; its URL, for `user`."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name} OWNER {PASSWORD_USER}")
        return self.url(name, user)

    def remove(self) -> None:
        with contextlib.suppress(AssertionError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def dbname(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    try:
        made.make()
        yield made
    finally:
        made.remove()
