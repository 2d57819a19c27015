"""Connecting to NATS with the settings every service shares."""

from __future__ import annotations

import logging
import re

import nats
from nats.aio.client import Client

from gpushare.bus.credentials import NatsCredentials

log = logging.getLogger(__name__)


def redact(urls: str) -> str:
    """NATS URLs without their user:password part (secrets never reach the logs)."""
    return ",".join(re.sub(r"//[^@/]*@", "//***@", url) for url in urls.split(","))


async def connect(url: str, name: str, credentials: NatsCredentials | None = None) -> Client:
    """A client that reconnects forever: a service outlives a nats-server restart.

    ``credentials`` (default: :meth:`NatsCredentials.from_env`) authenticate it and turn
    TLS on; they are never logged.
    """
    shown = redact(url)
    credentials = NatsCredentials.from_env() if credentials is None else credentials

    async def on_error(error: Exception) -> None:
        log.warning("nats: %s", error)

    async def on_disconnect() -> None:
        log.warning("nats: disconnected from %s", shown)

    async def on_reconnect() -> None:
        log.info("nats: reconnected to %s", shown)

    return await nats.connect(
        servers=url.split(","),
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        **credentials.connect_options(url),
    )
