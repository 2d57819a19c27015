"""One trace per pod: the derived root, and which parent a span gets."""

from __future__ import annotations

import hashlib

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer, format_trace_id, get_current_span

from gpushare.telemetry.pods import pod_span, pod_span_context, pod_trace_id
from gpushare.telemetry.propagation import extract_headers, inject_headers

UID = "5b0c1f4e-2a7d-4f3b-9c1e-0d2f6a8b9c10"


def test_the_pod_root_is_derived_from_the_uid_alone() -> None:
    root = pod_span_context(UID)

    assert root == pod_span_context(UID)
    assert root.trace_id != pod_span_context(UID + "x").trace_id
    assert pod_trace_id(UID) == hashlib.sha256(UID.encode()).hexdigest()[:32]
    assert root.is_remote
    assert root.trace_flags.sampled
    assert root.span_id != 0


def test_without_any_context_a_span_is_a_child_of_the_pod_root(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    with pod_span("extender filter", UID, tracer=tracer):
        pass
    with pod_span("extender bind", UID, tracer=tracer):
        pass

    spans = exporter.get_finished_spans()
    root = pod_span_context(UID)
    assert [span.context.trace_id for span in spans] == [root.trace_id] * 2
    assert all(span.parent is not None and span.parent.span_id == root.span_id for span in spans)
    assert format_trace_id(spans[0].context.trace_id) == pod_trace_id(UID)


def test_the_current_span_wins_over_the_pod_root(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    with (
        pod_span("binder bind", UID, tracer=tracer) as outer,
        pod_span("append PodBound", UID, tracer=tracer),
    ):
        pass

    inner = exporter.get_finished_spans()[0]
    assert inner.parent is not None
    assert inner.parent.span_id == outer.get_span_context().span_id


def test_an_incoming_context_wins_over_everything(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("caller") as caller:
        headers: dict[str, str] = {}
        inject_headers(headers)
    incoming = extract_headers(headers)

    with (
        pod_span("other", "another-uid", tracer=tracer),
        pod_span("binder bind", UID, incoming=incoming, tracer=tracer),
    ):
        pass

    bound = next(span for span in exporter.get_finished_spans() if span.name == "binder bind")
    assert bound.context.trace_id == caller.get_span_context().trace_id
    assert bound.parent is not None
    assert bound.parent.span_id == caller.get_span_context().span_id


def test_an_exception_in_the_block_marks_the_span_failed(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    with pytest.raises(RuntimeError), pod_span("append PodReserved", UID, tracer=tracer):
        raise RuntimeError("conflict")

    (span,) = exporter.get_finished_spans()
    assert not span.status.is_ok
    assert span.events[0].name == "exception"


def test_a_pod_without_uid_starts_a_trace_of_its_own(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    with pod_span("extender filter", "", tracer=tracer):
        pass

    (span,) = exporter.get_finished_spans()
    assert span.parent is None


def test_with_no_provider_the_pod_root_is_current_inside_and_only_there() -> None:
    assert not get_current_span().get_span_context().is_valid
    with pod_span("binder bind", UID) as span:
        assert not span.is_recording()
        assert get_current_span().get_span_context() == pod_span_context(UID)
        with pod_span("binder patch", UID + "other"):
            inner = get_current_span().get_span_context()
        assert inner == pod_span_context(UID)  # the current span wins, as with a tracer
        headers: dict[str, str] = {}
        inject_headers(headers)
    assert not get_current_span().get_span_context().is_valid
    extracted = extract_headers(headers)
    assert extracted is not None
    assert get_current_span(extracted).get_span_context().trace_id == pod_span_context(UID).trace_id
