"""Spans for appending to and consuming from the allocation log (NATS JetStream).

An append is a ``PRODUCER`` span whose context travels in the message's headers as
``traceparent``, next to ``Nats-Msg-Id``; whoever handles the message makes its
``CONSUMER`` span a child of it (:func:`consume_span`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from gpushare.telemetry.pods import NODE, POD_UID, pod_span
from gpushare.telemetry.propagation import extract_headers, inject_headers

SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION = "messaging.operation.type"
MESSAGE_ID = "messaging.message.id"
EVENT_TYPE = "gpushare.event.type"
SEQUENCE = "gpushare.log.sequence"
EXPECTED_SEQUENCE = "gpushare.log.expected_last_sequence"


@contextmanager
def append_span(
    subject: str,
    *,
    event_type: str,
    event_id: str,
    node: str,
    pod_uid: str | None,
    headers: MutableMapping[str, str],
    expected_last_seq: int | None = None,
) -> Iterator[Span]:
    """The span of one append; puts its context into ``headers``."""
    attributes: dict[str, AttributeValue] = {
        SYSTEM: "nats",
        DESTINATION: subject,
        OPERATION: "send",
        MESSAGE_ID: event_id,
        EVENT_TYPE: event_type,
        NODE: node,
    }
    if pod_uid:
        attributes[POD_UID] = pod_uid
    if expected_last_seq is not None:
        attributes[EXPECTED_SEQUENCE] = expected_last_seq
    name = f"append {event_type}"
    with pod_span(name, pod_uid, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        inject_headers(headers)
        yield span


@contextmanager
def consume_span(
    name: str,
    headers: Mapping[str, str] | None,
    *,
    subject: str,
    pod_uid: str | None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Iterator[Span]:
    """A ``CONSUMER`` span, child of the context in the message's ``headers`` when it has
    one (else of the pod's root)."""
    merged: dict[str, AttributeValue] = {SYSTEM: "nats", DESTINATION: subject, OPERATION: "process"}
    merged.update(attributes or {})
    if pod_uid:
        merged[POD_UID] = pod_uid
    with pod_span(
        name,
        pod_uid,
        incoming=extract_headers(headers),
        kind=SpanKind.CONSUMER,
        attributes=merged,
    ) as span:
        yield span
