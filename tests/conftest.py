"""Shared fixtures: a real nats-server with JetStream per test, on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from gpushare.bus.connection import connect
from gpushare.bus.streams import ensure_streams
from gpushare.embedded.nats_server import NatsServer


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
