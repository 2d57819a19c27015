"""Poison messages: terminated where they were, recorded in ``GPUSHARE_REJECTED``.

A message a consumer can never handle (it does not decode, or handling it failed every
time it was tried) must not be redelivered forever, and must not vanish either: its
raw bytes are published to the rejected stream, with headers naming the stream,
sequence and subject it came from and why it was refused, and only then is it
terminated. ``Nats-Msg-Id`` is ``<stream>:<seq>``, so a message recorded again (a
redelivery that raced the term, two binder replicas) is written once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError, NotFoundError
from prometheus_client import Counter

from gpushare.bus.log import MSG_ID
from gpushare.bus.sourcing import origin
from gpushare.bus.subjects import REJECTED_STREAM, rejected_subject

log = logging.getLogger(__name__)

STREAM = "Gpushare-Rejected-Stream"
SEQUENCE = "Gpushare-Rejected-Sequence"
SUBJECT = "Gpushare-Rejected-Subject"
ERROR = "Gpushare-Rejected-Error"
MAX_ERROR_LENGTH = 1024
"""A header is one line; a longer explanation is cut (the raw message is kept whole)."""

REJECTED = Counter(
    "gpushare_rejected_messages",
    "Messages terminated as poison, by the stream they came from and whether the "
    "rejected stream recorded them.",
    ["stream", "recorded"],
)


class Rejected(msgspec.Struct, frozen=True, kw_only=True):
    """One record of the rejected stream."""

    stream: str
    """The stream the message was on."""
    seq: int
    """Its sequence there."""
    subject: str
    error: str
    """Why it was refused."""
    data: bytes
    """The message as it was, byte for byte."""


def _one_line(text: str) -> str:
    """A header value: printable ASCII on one line (others escaped), at most 1 KiB."""
    escaped = text.encode("ascii", "backslashreplace").decode("ascii")
    flat = "".join(char if char.isprintable() else " " for char in escaped)
    return flat[:MAX_ERROR_LENGTH]


def rejection_id(stream: str, seq: int) -> str:
    return f"{stream}:{seq}"


async def record_rejected(
    js: JetStreamContext, *, stream: str, seq: int, subject: str, data: bytes, error: str
) -> int:
    """Publish a poison message to the rejected stream; returns the record's sequence.

    Raises what publishing raises (``NoStreamResponseError`` when there is no rejected
    stream: :func:`gpushare.bus.streams.ensure_streams` creates it).
    """
    headers = {
        MSG_ID: rejection_id(stream, seq),
        STREAM: stream,
        SEQUENCE: str(seq),
        SUBJECT: _one_line(subject),
        ERROR: _one_line(error),
    }
    ack = await js.publish(rejected_subject(stream), data, headers=headers)
    if not ack.duplicate:
        log.warning("recorded rejected message %s seq %d on %s: %s", stream, seq, subject, error)
    return int(ack.seq)


async def reject(js: JetStreamContext, msg: Msg, error: str) -> None:
    """Record the JetStream message ``msg`` as rejected, then terminate it.

    Without a rejected stream (a deployment that never ran ``ensure_streams`` since it
    was added) the message is terminated all the same: redelivering it forever would
    poison the consumer. Any other failure to record propagates, and the message is
    left to be redelivered and rejected again.
    """
    stream, seq = origin(msg)  # a message of the binders' queue is the log's
    recorded = True
    try:
        await record_rejected(
            js, stream=stream, seq=seq, subject=msg.subject, data=msg.data, error=error
        )
    except NoStreamResponseError:
        recorded = False
        log.error(
            "no %s stream to record rejected message %s seq %d (%s); terminating it anyway",
            REJECTED_STREAM,
            stream,
            seq,
            error,
        )
    REJECTED.labels(stream, "yes" if recorded else "no").inc()
    await msg.term()


async def read_rejected(
    js: JetStreamContext, stream: str | None = None, after_seq: int = 0
) -> AsyncIterator[Rejected]:
    """The records of the rejected stream (of one origin ``stream``, or all), in order."""
    subject = rejected_subject(stream) if stream else rejected_subject("*")
    seq = after_seq + 1
    while True:
        try:
            raw = await js.get_msg(
                REJECTED_STREAM, seq=seq, subject=subject, next=True, direct=True
            )
        except NotFoundError:
            return
        assert raw.seq is not None
        seq = raw.seq + 1
        headers = raw.headers or {}
        yield Rejected(
            stream=headers.get(STREAM, ""),
            seq=int(headers.get(SEQUENCE, "0")),
            subject=headers.get(SUBJECT, ""),
            error=headers.get(ERROR, ""),
            data=raw.data or b"",
        )
