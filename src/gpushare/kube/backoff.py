"""How long a list-and-watch loop waits before it lists again after a failure.

client-go's reflector waits 0.8 s after a failed list or watch, twice as long after each
further one, up to 30 s, and starts again from 0.8 s once two minutes pass without one.
A constant wait instead turns an API server that fails every watch (overloaded, or its
watch cache behind etcd: "Too large resource version") into a full list a second from
every informer: at 10,000 nodes, 100 MB of JSON a second from the allocator alone.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

INITIAL_S = 0.8
CAP_S = 30.0
RESET_AFTER_S = 120.0


class RelistBackoff:
    """Doubling waits from ``initial_s`` up to ``cap_s``, each lengthened by up to
    ``jitter`` of itself at random (so that many clients do not list in step); back to
    ``initial_s`` once ``reset_after_s`` pass without a failure."""

    def __init__(
        self,
        initial_s: float = INITIAL_S,
        *,
        cap_s: float = CAP_S,
        reset_after_s: float = RESET_AFTER_S,
        jitter: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._initial_s = initial_s
        self._cap_s = max(cap_s, initial_s)
        self._reset_after_s = reset_after_s
        self._jitter = jitter
        self._clock = clock
        self._draw = draw
        self._next_s = initial_s
        self._last_failure: float | None = None

    def after_failure(self) -> float:
        """The wait before listing again, for a failure now."""
        now = self._clock()
        if self._last_failure is not None and now - self._last_failure >= self._reset_after_s:
            self._next_s = self._initial_s
        self._last_failure = now
        wait = self._next_s
        self._next_s = min(self._cap_s, wait * 2)
        return wait * (1 + self._jitter * self._draw())
