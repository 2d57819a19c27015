"""Allocators served by uvicorn on free ports, over the per-test nats-server (fixture `js`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx
from nats.js import JetStreamContext

from gpushare.allocator.runtime import RunningAllocator, running_allocator
from gpushare.allocator.settings import AllocatorSettings
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.core.events import InventoryReported


def allocator_settings(**overrides: Any) -> AllocatorSettings:
    fields: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "replica_id": "allocator-a"}
    return AllocatorSettings(**(fields | overrides))


async def publish(js: JetStreamContext, events: Iterable[Any]) -> None:
    """Inventory to its stream, everything else appended to the allocation log."""
    log = AllocationLog(js)
    for event in events:
        if isinstance(event, InventoryReported):
            await publish_inventory(js, event)
        else:
            await log.append(event)


@contextlib.asynccontextmanager
async def extender(
    js: JetStreamContext, settings: AllocatorSettings | None = None, **options: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, RunningAllocator]]:
    """A running allocator and an HTTP client pointed at it."""
    async with (
        running_allocator(js, settings or allocator_settings(), **options) as running,
        httpx.AsyncClient(base_url=running.url, timeout=30) as client,
    ):
        yield client, running
