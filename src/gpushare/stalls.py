"""Every thread's stack, written when an event loop stops turning.

faulthandler's watchdog is a C thread that needs neither the event loop nor the GIL, so
it still writes when the process is wedged: a call into a C extension that holds the GIL
while it waits for a thread that wants it, or a callback that never returns. The loop
pushes the watchdog's deadline forward a few times per period; a loop that stops turning
lets it pass, and the stacks (every ``stall_seconds`` while the stall lasts) name the
call it is stuck in.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import sys
from typing import TextIO

STALL_SECONDS = 30.0


async def dump_stacks_on_stall(
    stop: asyncio.Event, stall_seconds: float = STALL_SECONDS, file: TextIO | None = None
) -> None:
    """Until ``stop``: if this loop does not turn for ``stall_seconds``, every thread's
    stack goes to ``file`` (standard error), and again every ``stall_seconds`` after."""
    out = sys.stderr if file is None else file
    try:
        while not stop.is_set():
            faulthandler.dump_traceback_later(stall_seconds, repeat=True, file=out)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), stall_seconds / 4)
    finally:
        faulthandler.cancel_dump_traceback_later()
