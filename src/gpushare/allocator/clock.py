"""The allocator's only source of time, injected so tests can pin it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]
"""Returns now, timezone-aware. Dates reservations and judges inventory staleness."""


def utc_now() -> datetime:
    return datetime.now(UTC)
