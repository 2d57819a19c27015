"""Waiting for a condition that another task or process brings about (no timing asserts)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

POLL_S = 0.02


async def eventually(condition: Callable[[], object], within: float = 20.0) -> None:
    """Return once ``condition()`` is truthy; fail the test if it never becomes so within
    ``within`` seconds of the clock (not of polls: on a busy loop each poll takes longer,
    and a test that outlives pytest's timeout takes its whole worker down)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() >= deadline:
            raise AssertionError(f"condition {condition} not reached within {within}s")
        await asyncio.sleep(POLL_S)
