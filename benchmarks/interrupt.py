"""A benchmark stopped by SIGTERM cleans up as one stopped by Ctrl-C does.

Python's default SIGTERM ends the process at once, without unwinding: the control plane,
the gpushare stack and nats-server a benchmark started kept running (the test kubelet
spun at 70 % of a core with nothing left to talk to). Outside an event loop SIGTERM
raises ``SystemExit`` in the main thread instead, which runs every ``with`` and
``finally`` on the way out; inside one it cancels the benchmark's task (an exception
raised in the middle of an event-loop callback would only break that callback), whose
``finally`` blocks run, and then exits.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable
from types import FrameType
from typing import TypeVar

T = TypeVar("T")
EXIT_STATUS = 128 + signal.SIGTERM


def _exit(_signum: int, _frame: FrameType | None) -> None:
    sys.exit(EXIT_STATUS)


def unwind_on_sigterm() -> None:
    """From now on SIGTERM unwinds the main thread (call it there, first thing)."""
    signal.signal(signal.SIGTERM, _exit)


async def cancelled_by_sigterm(work: Awaitable[T]) -> T:
    """Await ``work`` as a task that SIGTERM cancels; exit once it has unwound."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        if task.cancelled():
            sys.exit(EXIT_STATUS)
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        unwind_on_sigterm()
