"""Appending to and reading from the allocation log and the inventory stream.

A reservation is appended with ``Nats-Expected-Last-Subject-Sequence`` set to the last
sequence its writer folded for that node: if anyone appended to the node since, the
server refuses (:class:`AppendConflict`) and the writer re-reads, re-folds and
re-decides. ``Nats-Msg-Id`` makes a retried append of the same decision harmless.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from gpushare.bus.provenance import decode_from, origin_of
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALLOCATION_STREAM,
    Writer,
    allocation_subject,
    inventory_subject,
    node_allocations,
    writer_of,
)
from gpushare.core.errors import AppendConflict
from gpushare.core.events import (
    AllocationEvent,
    AnyEvent,
    InventoryReported,
    encode_event,
)
from gpushare.core.state import Folded, Unfolded
from gpushare.telemetry.messaging import SEQUENCE, append_span

log = logging.getLogger(__name__)

WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream error codes for a failed expected-last-sequence check (as nats.py's KV uses)."""

EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
"""The subject filter the expected sequence is checked on: all of the node's writers."""
MSG_ID = "Nats-Msg-Id"


class AllocationLog:
    """The allocation stream, as the services use it: the JetStream adapter of the core's
    :class:`gpushare.core.ports.AllocationLog`."""

    def __init__(self, js: JetStreamContext, writer: Writer | None = None) -> None:
        """``writer`` names the role whose subject every append goes to (default: each
        event's own, :func:`~gpushare.bus.subjects.writer_of`)."""
        self._js = js
        self.writer = writer

    async def append(self, event: AllocationEvent, expected_last_seq: int | None = None) -> int:
        """Append ``event`` to its node's subject; returns its stream sequence.

        With ``expected_last_seq`` the append is a compare-and-set on the node subject.
        A duplicate of an event already appended (same ``id``) returns the original sequence.
        """
        headers = {MSG_ID: event.id}
        if expected_last_seq is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected_last_seq)
            headers[EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT] = node_allocations(event.node)
        subject = allocation_subject(event.node, self.writer or writer_of(event))
        pod = getattr(event, "pod", None)
        with append_span(
            subject,
            event_type=type(event).__name__,
            event_id=event.id,
            node=event.node,
            pod_uid=pod.uid if pod is not None else None,
            headers=headers,  # gets the span's traceparent
            expected_last_seq=expected_last_seq,
        ) as span:
            try:
                ack = await self._js.publish(subject, encode_event(event), headers=headers)
            except APIError as error:
                if error.err_code in WRONG_LAST_SEQUENCE:
                    raise AppendConflict(str(error.description)) from error
                raise
            span.set_attribute(SEQUENCE, int(ack.seq))
        return int(ack.seq)

    def read_node(self, node: str, after_seq: int) -> AsyncIterator[tuple[int, AnyEvent]]:
        """Every event on ``node``'s subject after ``after_seq``, in order, as of now."""
        return self.read(node_allocations(node), after_seq)

    def read_node_folded(self, node: str, after_seq: int) -> AsyncIterator[tuple[int, Folded]]:
        """As :meth:`read_node`, with the :class:`Unfolded` messages (see :meth:`read_folded`)."""
        return self.read_folded(node_allocations(node), after_seq)

    async def read(
        self, subject: str = ALL_ALLOCATIONS, after_seq: int = 0
    ) -> AsyncIterator[tuple[int, AnyEvent]]:
        """Every event on ``subject`` (wildcards allowed) after ``after_seq``, as of now;
        messages that are not events to fold are skipped (and logged)."""
        async for seq, item in self.read_folded(subject, after_seq):
            if not isinstance(item, Unfolded):
                yield seq, item

    async def read_folded(
        self, subject: str = ALL_ALLOCATIONS, after_seq: int = 0
    ) -> AsyncIterator[tuple[int, Folded]]:
        """As :meth:`read`, with an :class:`Unfolded` in place of each message on a
        node's subject that did not decode or came from a writer that may not write it
        (:mod:`gpushare.bus.provenance`): the fold steps over it."""
        seq = after_seq + 1
        while True:
            try:
                raw = await self._js.get_msg(
                    ALLOCATION_STREAM, seq=seq, subject=subject, next=True, direct=True
                )
            except NotFoundError:
                return
            assert raw.seq is not None
            seq = raw.seq + 1
            subject_ = raw.subject or ""
            try:
                event = decode_from(subject_, raw.data or b"")
            except msgspec.MsgspecError as error:
                log.error("not folding message %d on %s: %s", raw.seq, subject_, error)
                origin = origin_of(subject_)
                if origin is not None:
                    yield raw.seq, Unfolded(node=origin.node)
                continue
            yield raw.seq, event

    async def last_seq(self) -> int:
        info = await self._js.stream_info(ALLOCATION_STREAM)
        return int(info.state.last_seq)


async def publish_inventory(js: JetStreamContext, event: InventoryReported) -> int:
    ack = await js.publish(
        inventory_subject(event.node), encode_event(event), headers={MSG_ID: event.id}
    )
    return int(ack.seq)
