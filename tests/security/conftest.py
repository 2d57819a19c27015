"""A nats-server with TLS (a trustme CA) and the generated users and permissions."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from nats.aio.client import Client

from gpushare.bus.connection import connect
from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.permissions import User, render_auth_conf, users
from gpushare.bus.streams import ensure_streams
from gpushare.embedded.nats_server import NatsServer

NODE_A = "gpu-a"
NODE_B = "gpu.b"
"""Node names as Kubernetes has them (the second with a dot, ``~`` in its subjects)."""


@dataclass(frozen=True)
class SecureNats:
    server: NatsServer
    ca_file: Path
    passwords: dict[str, str]

    @property
    def url(self) -> str:
        return self.server.url

    def credentials(self, user: str, password: str | None = None) -> NatsCredentials:
        secret = self.passwords[user] if password is None else password
        return NatsCredentials(user=user, password=secret, ca_file=str(self.ca_file))

    async def connect(self, user: str) -> Client:
        return await connect(self.url, name=f"test-{user}", credentials=self.credentials(user))


def write_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 it signed: (ca, cert, key) files."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    paths = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    ca.cert_pem.write_to_path(str(paths[0]))
    paths[1].write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(paths[2]))
    return paths


def write_config(directory: Path, cert: Path, key: Path, all_users: tuple[User, ...]) -> Path:
    config = directory / "nats.conf"
    tls = f'tls {{\n  cert_file: "{cert}"\n  key_file: "{key}"\n}}\n'
    config.write_text(tls + render_auth_conf(all_users))
    return config


@pytest.fixture
def secure_nats(tmp_path: Path) -> Iterator[SecureNats]:
    all_users = users([NODE_A, NODE_B])
    ca, cert, key = write_tls(tmp_path)
    config = write_config(tmp_path, cert, key, all_users)
    passwords = {user.name: secrets.token_hex(16) for user in all_users}
    env = {user.password_env: passwords[user.name] for user in all_users}
    server = NatsServer(tmp_path / "jetstream", config=config, tls=True, env=env).start()
    try:
        yield SecureNats(server, ca, passwords)
    finally:
        server.stop()


@pytest.fixture
async def admin(secure_nats: SecureNats) -> AsyncIterator[Client]:
    """Admin's client, the streams created by it (as a deployment's set-up job does)."""
    client = await secure_nats.connect("admin")
    try:
        await ensure_streams(client.jetstream())
        yield client
    finally:
        await client.close()
