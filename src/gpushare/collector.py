"""The garbage collector's settings for a long-running gpushare service.

Every service holds many long-lived objects: its fold of the log, its memos, and the
modules it imports (the Kubernetes client and gRPC alone are hundreds of thousands).
With Python's default thresholds (700, 10, 10) a full collection walks all of them
every seventy thousand or so allocations, and a service that folds a few events per pod
spent a third of its CPU there (``perf`` on the node agents during ``make bench-kube``:
``gc_collect_main`` and its visitors 33 %). So each service collects young objects less
often (:data:`THRESHOLDS`) and freezes what it holds out of the collector's sight
(:func:`freeze`): once imported (:func:`settle`, called by each process's entry point,
never by code a test runs in its own process), and the allocator again once it has
replayed the log. What a service allocates afterwards is still collected.
"""

from __future__ import annotations

import asyncio
import gc
import logging

log = logging.getLogger(__name__)

THRESHOLDS = (100_000, 50, 100)
"""The collector's generation thresholds in every service (Python's: 700, 10, 10). In the
allocator they took prioritize's p99 from 5.9 to 2.5 ms for 500 of 5,000 nodes (with
:func:`freeze`)."""


def collect_rarely() -> None:
    """Young collections every :data:`THRESHOLDS`\\ [0] allocations, full ones seldom."""
    gc.set_threshold(*THRESHOLDS)


def settle(service: str) -> None:
    """A service process's start: :func:`collect_rarely`, and :func:`freeze` the modules."""
    collect_rarely()
    freeze(service)


def freeze(service: str) -> None:
    """Collect once, then move every object left out of the collector's sight."""
    gc.collect()
    gc.freeze()
    log.info("%s: %d objects frozen out of the collector's sight", service, gc.get_freeze_count())


async def freeze_when(ready: asyncio.Event, service: str) -> None:
    """:func:`freeze` once ``ready`` is set (a fold caught up with the log)."""
    await ready.wait()
    freeze(service)
