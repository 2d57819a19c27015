"""Appending the binder's events, riding out short NATS outages.

A release or a bind verdict must reach the log: if it is lost, memory stays reserved
(or kube-scheduler waits for an answer). The NATS client reconnects by itself, so a few
spaced retries cover a server restart; ids make the retries harmless.
"""

from __future__ import annotations

import logging

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_incrementing,
)

from gpushare.bus.nats_types import NatsError
from gpushare.core.events import AllocationEvent
from gpushare.core.ports import AllocationLog

log = logging.getLogger(__name__)


async def append_event(
    allocation_log: AllocationLog, event: AllocationEvent, attempts: int = 5, delay: float = 1.0
) -> int:
    """Append ``event`` (no compare-and-set); returns its sequence. NATS errors and
    timeouts are retried after ``delay``, ``2 * delay``...; the last one is raised after
    ``attempts``."""

    def warn(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning("appending %s %s failed (%s); retrying", type(event).__name__, event.id, error)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_incrementing(start=delay, increment=delay),
        retry=retry_if_exception_type((NatsError, TimeoutError)),
        before_sleep=warn,
        reraise=True,
    )
    return await retrying(allocation_log.append, event)
