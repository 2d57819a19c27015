"""KubeClient's event-loop pool: a burst of requests shares a bounded set of connections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from kubernetes import client

from gpushare.kube.client import POOL_CONNECTIONS, KubeClient

BURST = 3 * POOL_CONNECTIONS


@pytest.fixture
async def api() -> AsyncIterator[tuple[str, set[object]]]:
    """An HTTP server answering every request after a moment, noting each connection."""
    peers: set[object] = set()

    async def answer(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        await asyncio.sleep(0.02)
        return web.json_response({"kind": "Status", "status": "Success"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", peers
    finally:
        await runner.cleanup()


async def test_a_burst_of_requests_opens_at_most_the_pool_s_connections(
    api: tuple[str, set[object]],
) -> None:
    host, peers = api
    kube = KubeClient(client.ApiClient(client.Configuration(host=host)))
    try:
        answers = await asyncio.gather(
            *(kube.request("read_namespaced_pod", "GET", f"/api/v1/p{n}") for n in range(BURST))
        )
    finally:
        await kube.aclose()
    assert [answer.status for answer in answers] == [200] * BURST
    assert 1 < len(peers) <= POOL_CONNECTIONS
