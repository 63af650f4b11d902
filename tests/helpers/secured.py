"""A `watchdog coordinator` subprocess on loopback with the flags a test gives it (a token file,
TLS), raw gRPC calls that send bytes of our choosing, and a CA that issues the certificates."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.helpers.harness import WATCHDOG, wait_for_output
from watchdog.cli.demo import free_port
from watchdog.transport.auth import ClientSecurity

TOKEN = "3f1c9e0b7a5d4c2e8f6a1b0c9d8e7f6a"
STATUS = "/torch_hang_watchdog.v1.Coordinator/Status"
CONNECT = "/torch_hang_watchdog.v1.Coordinator/Connect"
OK, INVALID, REFUSED_CODE = (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
                             grpc.StatusCode.UNAUTHENTICATED)


@dataclass
class Daemon:
    address: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@contextmanager
def coordinator(tmp: Path, *flags: str) -> Iterator[Daemon]:
    address = f"127.0.0.1:{free_port()}"
    log = tmp / f"coordinator-{address.rsplit(':')[1]}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*WATCHDOG, "coordinator", "--listen", address, "--db",
                                 str(tmp / "incidents.db"), *flags],
                                stdout=out, stderr=subprocess.STDOUT)
    daemon = Daemon(address, proc, log)
    try:
        wait_for_output(proc, daemon.output, "listening on")
        yield daemon
    finally:
        proc.terminate()
        proc.wait(15)


def token_file(tmp: Path, token: str = TOKEN, mode: int = 0o600) -> str:
    path = tmp / f"token-{token[:8]}-{mode:o}"
    path.write_text(token + "\n")
    path.chmod(mode)
    return str(path)


def raw_call(address: str, method: str, payload: bytes,
             token: str | None = None) -> grpc.StatusCode:
    """Send `payload` as the one request message of `method`, as bytes; the call's status."""
    metadata = ClientSecurity(token).metadata()
    with grpc.insecure_channel(address) as channel:
        try:
            if method == STATUS:
                channel.unary_unary(method)(payload, timeout=20, metadata=metadata)
            else:
                for _ in channel.stream_stream(method)(iter([payload]), timeout=20,
                                                       metadata=metadata):
                    pass
        except grpc.RpcError as e:
            return e.code()
    return OK


# -- TLS -------------------------------------------------------------------------------------

PLAIN_KEY = serialization.NoEncryption()


@dataclass
class Certs:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_key: str


def write_key(path: Path, key: ec.EllipticCurvePrivateKey,
               encryption: serialization.KeySerializationEncryption = PLAIN_KEY) -> str:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8, encryption))
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate."""
    tmp = tmp_path_factory.mktemp("certs")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "watchdog test CA")])

    def issue(name: x509.Name, key: ec.EllipticCurvePrivateKey,
              extension: x509.ExtensionType, critical: bool) -> bytes:
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(extension, critical=critical).sign(ca_key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM)

    (tmp / "ca.pem").write_bytes(issue(ca_name, ca_key, x509.BasicConstraints(True, None), True))
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    (tmp / "server.pem").write_bytes(issue(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coordinator")]), server_key,
        x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                     x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False))
    (tmp / "client.pem").write_bytes(issue(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agent")]), client_key,
        x509.SubjectAlternativeName([x509.DNSName("agent")]), False))
    return Certs(str(tmp / "ca.pem"), str(tmp / "server.pem"),
                 write_key(tmp / "server.key", server_key), str(tmp / "client.pem"),
                 write_key(tmp / "client.key", client_key),
                 write_key(tmp / "other.key", ec.generate_private_key(ec.SECP256R1())))
