"""Serving Prometheus metrics at ``/metrics`` from a service's own event loop.

The binder, the reporter and the node agent have no HTTP server of their own; this is
the smallest one that can await before it answers: each scrape first runs the
``refresh`` coroutines (the log lag reads the stream's last sequence), then writes the
registries in the text format. Port 0 picks a free port; :attr:`MetricsServer.port`
says which.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

Refresh = Callable[[], Awaitable[None]]


def render(registries: Sequence[CollectorRegistry]) -> bytes:
    """The registries' samples, one after the other (their metric names must differ)."""
    return b"".join(generate_latest(registry) for registry in registries)


class MetricsServer:
    def __init__(
        self,
        registries: Sequence[CollectorRegistry] = (REGISTRY,),
        refreshes: Sequence[Refresh] = (),
        *,
        host: str = "0.0.0.0",
        port: int = 0,
    ) -> None:
        self.registries = list(registries)
        self.refreshes = list(refreshes)
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        for refresh in self.refreshes:
            await refresh()
        body = render(self.registries)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> MetricsServer:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        log.info("serving Prometheus metrics on %s:%d/metrics", self.host, self.port)
        return self

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/metrics"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve_metrics(
    port: int, collectors: Sequence[Collector] = (), refreshes: Sequence[Refresh] = ()
) -> MetricsServer:
    """The process-wide registry plus ``collectors`` (a service's own, such as its log
    lag), served on ``port`` (0: any free port)."""
    own = CollectorRegistry()
    for collector in collectors:
        own.register(collector)
    return await MetricsServer([REGISTRY, own], refreshes, port=port).start()
