"""NATS for ``gpushare up`` as ``deploy/`` runs it: TLS, and a user per service and node.

At each start the stack writes a fresh set into ``<data dir>/nats/`` (mode 0700):

* ``ca.pem``: a CA made for this run (its key is never written); ``server.pem`` and
  ``server-key.pem`` (0600): nats-server's certificate for 127.0.0.1 and localhost;
* ``passwords/<user>`` (0600): a random password for each user of
  :func:`gpushare.bus.permissions.users` (``allocator``, ``binder``, ``node-<node>``,
  ``auditor``, ``admin``);
* ``nats.conf``: the ``tls`` block and the ``authorization`` rendered from the same
  permissions as ``deploy/``'s ``auth.conf``; each password is ``$GPUSHARE_NATS_PASSWORD_<USER>``,
  handed to nats-server in its environment only (:meth:`SecureBus.server_env`);
* ``auditor.env`` and ``admin.env``: the ``GPUSHARE_NATS_*`` variables an operator command
  reads (``set -a; . .gpushare/nats/auditor.env; set +a; gpushare audit``).

Each service process gets its own user's variables (:meth:`SecureBus.client_env`, user from
:func:`service_user`): allocator replicas ``allocator``, binder replicas ``binder``, a
node's reporter and node agent ``node-<node>``. The password reaches it as a file
(``GPUSHARE_NATS_PASSWORD_FILE``), never on a command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpushare.bus import credentials as variables
from gpushare.bus.connection import connect
from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.permissions import User, node, render_auth_conf, users
from gpushare.bus.streams import ensure_streams

SERVER_DNS_NAMES = ("localhost",)
SERVER_IPS = ("127.0.0.1",)
"""Where nats-server listens (``NatsServer`` binds 127.0.0.1): its certificate names both."""
CERTIFICATE_DAYS = 365
TLS_TIMEOUT_SECONDS = 5
"""The TLS handshake's limit on the server (as ``deploy/``): a busy machine handshakes slowly."""
OPERATOR_USERS = ("auditor", "admin")
"""Users that get an ``<user>.env`` file for operator commands."""
PASSWORD_BYTES = 24
URL_VARIABLE = "GPUSHARE_NATS_URL"
"""The operator commands' default ``--nats`` (:mod:`gpushare.cli.target`)."""


@dataclass(frozen=True)
class Certificates:
    """PEM bytes: the CA's certificate, and the server's certificate and key it signed."""

    ca_cert: bytes
    server_cert: bytes
    server_key: bytes = field(repr=False)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def issue_certificates(now: datetime, days: int = CERTIFICATE_DAYS) -> Certificates:
    """A new CA (ECDSA P-256) and a server certificate for 127.0.0.1 and localhost,
    valid from an hour before ``now`` (clocks differ) for ``days``."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    server_key = ec.generate_private_key(ec.SECP256R1())
    start, end = now - timedelta(hours=1), now + timedelta(days=days)
    ca_name = _name("gpushare up local CA")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in SERVER_DNS_NAMES]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVER_IPS]
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("gpushare up nats-server"))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Certificates(
        ca_cert=ca.public_bytes(serialization.Encoding.PEM),
        server_cert=server.public_bytes(serialization.Encoding.PEM),
        server_key=server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def new_password() -> str:
    """Random hex behind a letter: nats-server parses a substituted ``$VARIABLE`` as config,
    and a value of digits alone would be a number, not a password."""
    return "g" + secrets.token_hex(PASSWORD_BYTES)


def render_server_config(cert: Path, key: Path, all_users: Iterable[User]) -> str:
    """nats-server's config: TLS required of every client, and the users' permissions."""
    tls = (
        "tls {\n"
        f"  cert_file: {json.dumps(str(cert))}\n"
        f"  key_file: {json.dumps(str(key))}\n"
        f"  timeout: {TLS_TIMEOUT_SECONDS}\n"
        "}\n"
    )
    head = "# Written by gpushare up at each start (gpushare.embedded.secure_bus).\n"
    return head + tls + render_auth_conf(all_users)


def service_user(command: str, node_name: str = "") -> str:
    """The NATS user a ``gpushare <command>`` process runs as: ``allocator``, ``binder``,
    or for a node's ``reporter`` and ``node-agent`` that node's ``node-<node>``."""
    if command in ("allocator", "binder"):
        return command
    if command in ("reporter", "node-agent") and node_name:
        return node(node_name).name
    raise ValueError(f"no NATS user for gpushare {command} {node_name}".rstrip())


@dataclass(frozen=True)
class SecureBus:
    """The files :func:`write_secure_bus` wrote, and how each user connects."""

    directory: Path
    all_users: tuple[User, ...]
    passwords: Mapping[str, str] = field(repr=False)
    """Each user's password, by user name."""

    @property
    def config(self) -> Path:
        return self.directory / "nats.conf"

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server-key.pem"

    def password_file(self, user: str) -> Path:
        return self.directory / "passwords" / user

    def env_file(self, user: str) -> Path:
        """``<user>.env`` (auditor and admin): the variables an operator command reads."""
        return self.directory / f"{user}.env"

    def server_env(self) -> dict[str, str]:
        """nats-server's environment: the passwords its config names as ``$VARIABLES``."""
        return {user.password_env: self.passwords[user.name] for user in self.all_users}

    def client_env(self, user: str) -> dict[str, str]:
        """What a process running as ``user`` reads (``NatsCredentials.from_env``)."""
        if user not in self.passwords:
            raise KeyError(f"no NATS user {user!r} in this stack")
        return {
            variables.USER: user,
            variables.PASSWORD_FILE: str(self.password_file(user)),
            variables.CA: str(self.ca_file),
        }

    def credentials(self, user: str) -> NatsCredentials:
        """``user``'s credentials, for a client in this process."""
        return NatsCredentials(user=user, password=self.passwords[user], ca_file=str(self.ca_file))


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by this user only (0600, also when ``path`` existed)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(data)


def write_secure_bus(
    directory: Path, nodes: Iterable[str], url: str = "", now: datetime | None = None
) -> SecureBus:
    """New certificates and passwords for ``nodes``' users, written into ``directory``
    (replacing what a previous start left). ``url`` goes into the operators' env files."""
    all_users = users(list(nodes))
    certificates = issue_certificates(now or datetime.now(UTC))
    bus = SecureBus(directory, all_users, {user.name: new_password() for user in all_users})
    (directory / "passwords").mkdir(parents=True, exist_ok=True)
    for folder in (directory, directory / "passwords"):
        folder.chmod(0o700)
    bus.ca_file.write_bytes(certificates.ca_cert)
    bus.server_cert.write_bytes(certificates.server_cert)
    write_private(bus.server_key, certificates.server_key)
    for user in all_users:
        write_private(bus.password_file(user.name), bus.passwords[user.name].encode() + b"\n")
    bus.config.write_text(render_server_config(bus.server_cert, bus.server_key, all_users))
    for user_name in OPERATOR_USERS:
        write_private(bus.env_file(user_name), env_text(bus.client_env(user_name), url).encode())
    return bus


def env_text(env: Mapping[str, str], url: str = "") -> str:
    """``NAME=value`` lines (for ``set -a; . FILE``), the NATS URL first when given."""
    pairs = {URL_VARIABLE: url, **env} if url else dict(env)
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in pairs.items())


def create_streams(url: str, credentials: NatsCredentials) -> None:
    """The streams, created as admin before any service starts (a deployment's set-up job):
    a node's services may only look at them, the others create one only if it is missing."""

    async def create() -> None:
        nc = await connect(url, name="gpushare-up-setup", credentials=credentials)
        try:
            await ensure_streams(nc.jetstream())
        finally:
            with quiet_goodbye():
                await nc.close()

    asyncio.run(create())


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


@contextlib.contextmanager
def quiet_goodbye() -> Iterator[None]:
    """A client closing on purpose is no news: no "disconnected" warning from the bus, no
    asyncio note that a TLS connection ignores its peer's EOF (``gpushare up`` prints what
    reaches the root logger)."""
    loggers = [logging.getLogger(name) for name in ("gpushare.bus.connection", "asyncio")]
    for logger in loggers:
        logger.addFilter(_errors_only)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(_errors_only)
