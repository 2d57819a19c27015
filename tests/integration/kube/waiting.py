"""Waiting for a condition that another task or process brings about (no timing asserts)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

POLL_S = 0.02


async def eventually(condition: Callable[[], object], within: float = 20.0) -> None:
    """Return once ``condition()`` is truthy; fail the test if it never becomes so."""
    for _ in range(int(within / POLL_S)):
        if condition():
            return
        await asyncio.sleep(POLL_S)
    raise AssertionError(f"condition {condition} not reached within {within}s")
