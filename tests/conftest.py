"""Shared fixtures (a real nats-server with JetStream per test, on a free port), and each
test's tier marker, given by its directory (``pytestmark`` in a conftest is not read)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from gpushare.bus.connection import connect
from gpushare.bus.streams import ensure_streams
from gpushare.embedded.nats_server import NatsServer
from tests import socket_origins

socket_origins.install()

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e", "k8s")
TIER_OF_DIRECTORY = {
    "unit": "unit",
    "integration": "integration",  # a real nats-server, HTTP or gRPC server in the test
    "security": "integration",  # nats-server with TLS and the generated permissions
    "fuzz": "integration",  # an allocator over uvicorn and nats-server per module
    "deploy": "integration",  # kubectl kustomize, nats-server, the services' parsers
    "e2e": "e2e",
    "k8s": "k8s",
}
"""A test's tier, unless the test names one itself (a ``k8s`` test among the e2e ones)."""


def tier_of(item: pytest.Item) -> str | None:
    """The tier a test is marked with, or else its directory's."""
    named = [tier for tier in TIERS if item.get_closest_marker(tier) is not None]
    if named:
        return named[0] if len(named) == 1 else None
    relative = Path(item.path).resolve().relative_to(TESTS)
    return TIER_OF_DIRECTORY.get(relative.parts[0]) if len(relative.parts) > 1 else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with its tier; a test with none or several is an error."""
    wrong = []
    for item in items:
        tier = tier_of(item)
        if tier is None:
            wrong.append(item.nodeid)
        elif item.get_closest_marker(tier) is None:
            item.add_marker(tier)
    if wrong:
        raise pytest.UsageError(f"tests without exactly one tier ({', '.join(TIERS)}): {wrong}")


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "jetstream").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    client = await connect(nats_server.url, name="test")
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def js(nc: Client) -> JetStreamContext:
    context = nc.jetstream()
    await ensure_streams(context)
    return context
