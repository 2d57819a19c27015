"""Recording the extender's decisions (filter, prioritize) for ``gpushare explain``.

The allocator answers kube-scheduler first and records afterwards: :meth:`DecisionRecorder.record`
only queues a builder (no encoding, no I/O, never an exception), and one background task
builds, encodes and publishes each record with a plain core-NATS ``publish``: the stream
``GPUSHARE_DECISIONS`` captures the subject, and nobody waits for an acknowledgement. When
NATS is down, slow or the queue is full, a record is dropped and counted, never waited for:
a lost explanation is better than a slower (or failed) scheduling decision.

Records leave in batches: the first of a batch waits ``BATCH_WAIT_S`` for the ones the
next calls make; they are built one per turn of the event loop (a request waiting goes
first: built all at once, a batch of filter records over 10,000 names held the loop for
milliseconds, and filter's p99 there went from 2 to 7 ms), and the batch goes out in one
write. Every write wakes nats-server, and on a busy machine a wake-up can hand it the
allocator's core in the middle of a scheduling cycle: two writes per pod (filter's
record, prioritize's) became one every ``BATCH_WAIT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from itertools import islice
from typing import Protocol

from nats.aio.client import Client

from gpushare.bus.log import MSG_ID
from gpushare.bus.subjects import decision_subject
from gpushare.core.events import AnyDecision, NodesFiltered, NodesScored, encode_decision
from gpushare.core.model import PodRef

log = logging.getLogger(__name__)

MAX_NODES = 1000
"""Most nodes named per list of one record; the rest are only counted (``omitted``)."""
QUEUE_SIZE = 1024
"""Records waiting to be published; more are dropped."""
BATCH_WAIT_S = 0.05
"""How long the first record of a batch waits for more before the batch is published."""

Builder = Callable[[], AnyDecision]
"""Makes one record; called off the extender's answer path."""


class Recorder(Protocol):
    """What the extender's verbs need: hand over a record to build and publish later."""

    def record(self, build: Builder) -> None: ...


def nodes_filtered(
    *,
    id: str,
    at: datetime,
    pod: PodRef,
    allocator: str,
    request: str,
    passed: Sequence[str],
    failed: Iterable[Mapping[str, str]],
    chosen: str | None = None,
    limit: int = MAX_NODES,
) -> NodesFiltered:
    """One filter call's record, at most ``limit`` nodes per list (``failed`` merges maps)."""
    reasons: dict[str, str] = {}
    total_failed = 0
    for part in failed:
        total_failed += len(part)
        reasons.update(islice(part.items(), max(0, limit - len(reasons))))
    kept = tuple(passed[:limit])
    omitted = len(passed) - len(kept) + total_failed - len(reasons)
    return NodesFiltered(
        id=id,
        at=at,
        pod=pod,
        allocator=allocator,
        request=request,
        passed=kept,
        failed=reasons,
        omitted=omitted,
        chosen=chosen,
    )


def nodes_scored(
    *,
    id: str,
    at: datetime,
    pod: PodRef,
    allocator: str,
    policy: str,
    names: Sequence[str],
    scores: Sequence[int],
    verb: str = "prioritize",
    unranked: int = 0,
    limit: int = MAX_NODES,
) -> NodesScored:
    """One prioritize call's record (or filter's, when it chose): the ``limit``
    best-scored nodes (ties in asked order); ``unranked`` more were left out before."""
    if len(names) != len(scores):
        raise ValueError(f"{len(names)} names but {len(scores)} scores")
    best = sorted(range(len(names)), key=scores.__getitem__, reverse=True)[:limit]  # stable
    kept = {names[at]: scores[at] for at in best}
    return NodesScored(
        id=id,
        at=at,
        pod=pod,
        allocator=allocator,
        policy=policy,
        scores=kept,
        omitted=len(names) - len(kept) + unranked,
        verb=verb,
    )


class DecisionRecorder:
    """Fire-and-forget publishing of decision records on one NATS connection."""

    def __init__(
        self, nc: Client, queue_size: int = QUEUE_SIZE, batch_wait_s: float = BATCH_WAIT_S
    ) -> None:
        self._nc = nc
        self._queue: asyncio.Queue[Builder] = asyncio.Queue(queue_size)
        self._built: deque[tuple[str, bytes, str]] = deque()
        """Records built and not published yet: (subject, payload, id)."""
        self._waiting: Builder | None = None
        """The first record of the next batch, while it waits for more."""
        self._batch_wait_s = batch_wait_s
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        self.dropped = 0

    def record(self, build: Builder) -> None:
        """Queue one record; returns at once and never raises."""
        try:
            self._queue.put_nowait(build)
        except asyncio.QueueFull:
            self._drop("the queue is full")

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="decision recorder")

    async def stop(self) -> None:
        """Publish what is built or queued (what NATS takes now), then stop."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self._waiting is not None:
            self._build(self._waiting)
            self._waiting = None
        while not self._queue.empty():
            self._build(self._queue.get_nowait())
        await self._publish_built()

    async def _run(self) -> None:
        while True:
            self._waiting = await self._queue.get()
            await asyncio.sleep(self._batch_wait_s)
            self._build(self._waiting)
            self._waiting = None
            while not self._queue.empty():
                # one record at a time: a request waiting on the loop goes first (a
                # record of a filter over 10,000 names is a fraction of a millisecond)
                await asyncio.sleep(0)
                self._build(self._queue.get_nowait())
            await self._publish_built()

    def _build(self, build: Builder) -> None:
        try:
            decision = build()
            subject = decision_subject(decision.pod.namespace, decision.pod.name)
            self._built.append((subject, encode_decision(decision), decision.id))
        except Exception as error:  # a record must never take the allocator down
            self._drop(f"{type(error).__name__}: {error}")

    async def _publish_built(self) -> None:
        """Publish what is built without a pause: nats-py writes it in one go."""
        while self._built:
            subject, payload, record_id = self._built.popleft()
            try:
                await self._nc.publish(subject, payload, headers={MSG_ID: record_id})
            except Exception as error:
                self._drop(f"{type(error).__name__}: {error}")
            else:
                self.published += 1

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("dropped a decision record (%d so far): %s", self.dropped, why)
