"""The system clock: the adapter of :class:`gpushare.core.ports.Clock` every service runs on."""

from __future__ import annotations

import time
from datetime import UTC, datetime


class SystemClock:
    """The machine's clocks: UTC wall time and ``time.monotonic``."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()
