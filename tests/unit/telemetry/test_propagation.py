"""Trace context in HTTP and NATS headers and gRPC metadata: what goes in comes out."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import Tracer

from gpushare.telemetry.propagation import (
    TRACEPARENT,
    attached,
    extract_headers,
    extract_metadata,
    inject_headers,
    inject_metadata,
    metadata_carrier,
)


def test_nothing_is_injected_without_a_span() -> None:
    headers = {"Nats-Msg-Id": "reserved-1"}

    inject_headers(headers)

    assert headers == {"Nats-Msg-Id": "reserved-1"}
    assert inject_metadata() == []


def test_nats_headers_carry_the_span_next_to_the_message_id(tracer: Tracer) -> None:
    headers = {"Nats-Msg-Id": "reserved-1"}
    with tracer.start_as_current_span("append") as span:
        inject_headers(headers)

    context = extract_headers(headers)

    assert headers["Nats-Msg-Id"] == "reserved-1"
    assert context is not None
    remote = trace.get_current_span(context).get_span_context()
    assert remote.trace_id == span.get_span_context().trace_id
    assert remote.span_id == span.get_span_context().span_id
    assert remote.is_remote


def test_headers_without_a_valid_traceparent_give_no_context() -> None:
    assert extract_headers(None) is None
    assert extract_headers({}) is None
    assert extract_headers({"Nats-Msg-Id": "x"}) is None
    assert extract_headers({TRACEPARENT: "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}) is None
    assert extract_headers({TRACEPARENT: "garbage"}) is None


def test_grpc_metadata_round_trips_and_skips_binary_values(tracer: Tracer) -> None:
    with tracer.start_as_current_span("kubelet") as span:
        metadata = inject_metadata()
    sent: list[tuple[str, str | bytes]] = [*metadata, ("trace-bin", b"\x00"), ("X-Other", "1")]

    context = extract_metadata(sent)

    assert [key for key, _ in metadata] == [TRACEPARENT]
    assert metadata_carrier(sent) == {TRACEPARENT: metadata[0][1], "x-other": "1"}
    assert context is not None
    assert trace.get_current_span(context).get_span_context().span_id == (
        span.get_span_context().span_id
    )
    assert extract_metadata(None) is None


def test_an_attached_context_is_current_only_inside_the_block(tracer: Tracer) -> None:
    with tracer.start_as_current_span("caller"):
        headers: dict[str, str] = {}
        inject_headers(headers)
    context = extract_headers(headers)

    with attached(context):
        inside = trace.get_current_span().get_span_context()
    with attached(None):
        unchanged = trace.get_current_span().get_span_context()

    assert inside.is_valid
    assert inside.is_remote
    assert not unchanged.is_valid
    assert not trace.get_current_span().get_span_context().is_valid
