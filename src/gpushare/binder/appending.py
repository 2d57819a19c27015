"""Appending the binder's events, riding out short NATS outages.

A release or a bind verdict must reach the log: if it is lost, memory stays reserved
(or kube-scheduler waits for an answer). The NATS client reconnects by itself, so a few
spaced retries cover a server restart; ids make the retries harmless.
"""

from __future__ import annotations

import asyncio
import logging

from nats.errors import Error as NatsError

from gpushare.bus.log import AllocationLog
from gpushare.core.events import AllocationEvent

log = logging.getLogger(__name__)


async def append_event(
    allocation_log: AllocationLog, event: AllocationEvent, attempts: int = 5, delay: float = 1.0
) -> int:
    """Append ``event`` (no compare-and-set); returns its sequence. Raises after ``attempts``."""
    for attempt in range(1, attempts + 1):
        try:
            return await allocation_log.append(event)
        except (NatsError, TimeoutError) as error:
            if attempt == attempts:
                raise
            log.warning(
                "appending %s %s failed (%s); retrying", type(event).__name__, event.id, error
            )
            await asyncio.sleep(delay * attempt)
    raise AssertionError("unreachable")
