"""Stopping asyncio tasks for good, even when a library swallows the cancellation.

On Python 3.11 ``asyncio.wait_for`` loses a cancellation that arrives as the awaited
operation completes (CPython gh-86296, fixed in 3.12), and nats-py awaits every JetStream
publish, request and flush through it: a task cancelled in the middle of one goes on
running as if nothing happened. A loop that publishes then never ends, and whoever
awaits it hangs (the binder's tests caught it: a heartbeat loop cancelled while
publishing kept beating, and the test waited on it until pytest's timeout took the
worker down). :func:`cancel_and_wait` cancels again until the tasks have finished, and
:func:`unless_stopped` gives up on a piece of work (a connect) that way when told to stop.
:func:`log_if_it_fails` says at once when a long-running task ends with an error, and
:func:`supervised` runs a service's loop again when it crashes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

RETRY_SECONDS = 0.5
"""How long a cancelled task has to finish before it is cancelled again."""
RESTART_SECONDS = 1.0
"""How long :func:`supervised` waits before it runs a crashed loop again."""


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


def log_if_it_fails(task: asyncio.Task[Any], what: str, logger: logging.Logger) -> None:
    """Log ``task``'s error the moment it ends with one, as ``"<what> ended: <error>"``
    with its traceback. A long-running task that is only gathered at shutdown otherwise
    dies without a word (the test kubelet's pod watcher did, and its node's pods stayed
    Pending while everything else in the process went on)."""

    def ended(finished: asyncio.Task[Any]) -> None:
        if not finished.cancelled() and (error := finished.exception()) is not None:
            logger.error("%s ended: %s", what, error, exc_info=error)

    task.add_done_callback(ended)


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or ``None`` (with ``work`` cancelled for good) if ``stop`` is
    set first; an error ``work`` ended with is raised."""
    working = asyncio.ensure_future(work)
    waiting = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({working, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(working, waiting)
    return None if working.cancelled() else working.result()


async def supervised(
    what: str,
    loop: Callable[[], Awaitable[None]],
    logger: logging.Logger,
    *,
    ends_quietly: tuple[type[Exception], ...] = (),
    restart_seconds: float = RESTART_SECONDS,
) -> None:
    """Run ``loop`` until it returns or this task is cancelled; when it crashes, log
    ``"<what> crashed; restarting it"`` with the traceback and run it again after
    ``restart_seconds``. An error in ``ends_quietly`` (the connection it serves is
    closed for good) ends it with an info line instead."""
    task = asyncio.current_task()
    while True:
        try:
            await loop()
            return
        except ends_quietly as error:
            logger.info("%s stops: %s", what, error or type(error).__name__)
            return
        except Exception:
            if task is not None and task.cancelling():
                # A library turned our cancellation into an error (nats-py does, on close).
                raise asyncio.CancelledError from None
            logger.exception("%s crashed; restarting it", what)
            await asyncio.sleep(restart_seconds)
