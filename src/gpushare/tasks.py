"""Stopping asyncio tasks for good, even when a library swallows the cancellation.

On Python 3.11 ``asyncio.wait_for`` loses a cancellation that arrives as the awaited
operation completes (CPython gh-86296, fixed in 3.12), and nats-py awaits every JetStream
publish, request and flush through it: a task cancelled in the middle of one goes on
running as if nothing happened. A loop that publishes then never ends, and whoever
awaits it hangs (the binder's tests caught it: a heartbeat loop cancelled while
publishing kept beating, and the test waited on it until pytest's timeout took the
worker down). :func:`cancel_and_wait` cancels again until the tasks have finished.
"""

from __future__ import annotations

import asyncio
from typing import Any

RETRY_SECONDS = 0.5
"""How long a cancelled task has to finish before it is cancelled again."""


async def cancel_and_wait(
    *tasks: asyncio.Future[Any], retry_seconds: float = RETRY_SECONDS
) -> None:
    """Cancel ``tasks`` and return once every one has finished. An exception a task
    ended with is marked retrieved, as ``gather(..., return_exceptions=True)`` would (no
    "never retrieved" report); read it from the task where it matters."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=retry_seconds)
    for task in tasks:
        if not task.cancelled():
            task.exception()
