"""One allocator per fuzz module, served by uvicorn over a real nats-server.

Starting nats-server and an allocator takes about a second, so each fuzz module shares
one (module-scoped fixture, module-scoped event loop) across its examples. The examples
themselves run in a worker thread with a synchronous HTTP client (:func:`fuzz`): the
event loop stays free to serve them, and the test can check, once Hypothesis is done,
that the same server still answers a valid call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from gpushare.bus.connection import connect
from gpushare.bus.streams import ensure_streams
from gpushare.core.events import InventoryReported
from gpushare.embedded.nats_server import NatsServer
from tests.integration.allocator.serving import allocator_settings, extender, publish
from tests.unit.allocator.builders import card, inventory, node_events

PREFIX = "/gpushare-scheduler"
KNOWN_NODES = ("gpu-node-1", "gpu-node-2", "N1", "sick", "stale")
"""The nodes the fuzzed allocator has inventory for (the recorded calls name the first two)."""
BODY_LIMIT = 256 * 1024
"""The fuzzed allocator's ``max_body_bytes``: small, so bodies around it are quick to send
(the default, 16 MiB, is checked in ``tests/integration/allocator/test_limits_http.py``)."""
HTTP_TIMEOUT_S = 10.0
"""Longer than kube-scheduler's default extender timeout (5 s): an answer slower than this
is a finding in itself."""


def cluster() -> list[object]:
    """Fresh, half-used, unhealthy and stale nodes, so every kind of verdict can come up."""
    stale: InventoryReported = inventory(
        "stale", [card("stale", 0)], datetime(2020, 1, 1, tzinfo=UTC)
    )
    return [
        inventory("gpu-node-1", [card("gpu-node-1", 0), card("gpu-node-1", 1)]),
        inventory("gpu-node-2", [card("gpu-node-2", 0), card("gpu-node-2", 1)]),
        *node_events("N1", [12207, 0]),
        inventory("sick", [card("sick", 0, healthy=False)]),
        stale,
    ]


@dataclass(frozen=True)
class Served:
    url: str
    """Base URL of the allocator; the verbs are under :data:`PREFIX`."""
    http: httpx.AsyncClient
    """A client for checks made from the test itself (on the event loop)."""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    server = NatsServer(Path(tmp_path_factory.mktemp("fuzz-jetstream"))).start()
    try:
        nc = await connect(server.url, name="fuzz")
        try:
            js = nc.jetstream()
            await ensure_streams(js)
            await publish(js, cluster())
            settings = allocator_settings(bind_wait_seconds=0.2, max_body_bytes=BODY_LIMIT)
            async with extender(js, settings) as (http, running):
                yield Served(url=running.url, http=http)
        finally:
            await nc.close()
    finally:
        server.stop()


async def fuzz(served: Served, examples: Callable[[httpx.Client], None]) -> None:
    """Run a Hypothesis test (``examples``, taking a client) in a thread against ``served``."""

    def run() -> None:
        with httpx.Client(base_url=served.url, timeout=HTTP_TIMEOUT_S) as client:
            examples(client)

    await asyncio.to_thread(run)
