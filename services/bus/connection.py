"""Connecting to NATS with the settings every service shares."""

from __future__ import annotations

import logging

import nats
from nats.aio.client import Client

log = logging.getLogger(__name__)


async def connect(url: str, name: str) -> Client:
    """A client that reconnects forever: a service outlives a nats-server restart."""

    async def on_error(error: Exception) -> None:
        log.warning("nats: %s", error)

    async def on_disconnect() -> None:
        log.warning("nats: disconnected from %s", url)

    async def on_reconnect() -> None:
        log.info("nats: reconnected to %s", url)

    return await nats.connect(
        servers=url.split(","),
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )
