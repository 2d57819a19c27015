"""A background task's doorbell: others ring it when there is work for it.

The task sleeps until the bell rings, the agent stops, or a timeout passes, instead of
waking on a timer to look for work that is rarely there (an idle agent on every GPU
node of a cluster should cost next to nothing).
"""

from __future__ import annotations

import asyncio
import contextlib


class Doorbell:
    def __init__(self) -> None:
        self._rung = asyncio.Event()

    def ring(self) -> None:
        """Wake the task (at once if it sleeps; its next wait returns at once if not)."""
        self._rung.set()

    async def wait(self, stop: asyncio.Event, seconds: float | None = None) -> bool:
        """Until the bell rings, ``stop`` is set or ``seconds`` pass (None: no limit);
        a ring is used up by the wait it ends. True when it ended by a ring."""
        rung = asyncio.ensure_future(self._rung.wait())
        halt = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({rung, halt}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            rung.cancel()
            halt.cancel()
        was_rung = self._rung.is_set()
        self._rung.clear()
        return was_rung

    def clear(self) -> None:
        """Forget rings so far (the work they asked for is about to be done)."""
        self._rung.clear()


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
