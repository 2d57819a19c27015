"""Reading a stream in order, fast: the catch-up of every fold, and the operator commands.

:func:`read_records` walks a stream (all of it, or one subject's part; from a sequence
or a time; up to a sequence) with an ordered push consumer, which the server streams
to us without a round trip per message. It stops when it has read what was there when
it started, or keeps following with ``follow=True``.

Records are handed out undecoded: each reader decodes with its own union and decides
what to do with bytes it cannot read.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

log = logging.getLogger(__name__)

FOLLOW_POLL_SECONDS = 1.0
PENDING_MESSAGES = 1 << 20
PENDING_BYTES = 512 << 20


@dataclass(frozen=True, slots=True)
class Record:
    """One stored message: where it sits in its stream, when it was stored, its bytes."""

    seq: int
    time: datetime
    subject: str
    data: bytes


def _start(start_seq: int, start_time: datetime | None) -> tuple[DeliverPolicy, ConsumerConfig]:
    if start_time is not None:
        return DeliverPolicy.BY_START_TIME, ConsumerConfig(opt_start_time=start_time)
    if start_seq > 1:
        return DeliverPolicy.BY_START_SEQUENCE, ConsumerConfig(opt_start_seq=start_seq)
    return DeliverPolicy.ALL, ConsumerConfig()


async def _last_seq(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.last_seq)


async def read_records(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    start_seq: int = 1,
    start_time: datetime | None = None,
    until_seq: int | None = None,
    follow: bool = False,
) -> AsyncIterator[Record]:
    """Messages of ``stream`` on ``subject`` (wildcards allowed) from ``start_seq`` (or the
    first stored at or after ``start_time``) to ``until_seq`` (inclusive), in order.

    Without ``follow`` it ends with the newest message that was stored when it began
    (or at ``until_seq``, whichever comes first); with ``follow`` it waits for more.
    """
    end = await _last_seq(js, stream) if not follow else None
    if until_seq is not None:
        end = until_seq if end is None else min(end, until_seq)
    if end is not None and (end < start_seq or end == 0):
        return
    policy, config = _start(start_seq, start_time)
    subscription = await js.subscribe(
        subject,
        stream=stream,
        ordered_consumer=True,
        deliver_policy=policy,
        config=config,
        pending_msgs_limit=PENDING_MESSAGES,
        pending_bytes_limit=PENDING_BYTES,
    )
    try:
        if end is not None and await _nothing_to_read(subscription, at_start=True):
            return
        while True:
            try:
                msg = await subscription.next_msg(timeout=FOLLOW_POLL_SECONDS)
            except NatsTimeout:
                if follow:
                    continue
                if await _nothing_to_read(subscription):
                    return
                continue
            metadata = msg.metadata
            seq = metadata.sequence.stream
            if end is not None and seq > end:
                return
            yield Record(seq, metadata.timestamp, msg.subject, msg.data)
            if end is not None and (seq >= end or metadata.num_pending == 0):
                return
    finally:
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()


async def _nothing_to_read(
    subscription: JetStreamContext.PushSubscription, at_start: bool = False
) -> bool:
    """No message for this filter is left on the server, and none is waiting with us.

    At start ``num_pending`` alone is not enough: the server may already have pushed
    every message into our buffer (pending 0, delivered > 0), which is the usual case.
    """
    info = await subscription.consumer_info()
    if info.num_pending != 0 or subscription.pending_msgs != 0:
        return False
    delivered = info.delivered.consumer_seq if info.delivered is not None else 0
    return not at_start or not delivered
