"""One trace per pod: a trace id derived from the pod's uid, and spans that join it.

kube-scheduler sends no trace context, its filter, prioritize and bind are three HTTP
calls, and a real kubelet's ``Allocate`` carries none either. So each service that
handles a pod without an incoming context parents its span on the same *pod root*: a
remote span context whose trace id is the first 16 bytes of ``sha256(uid)`` and whose
span id the next 8. Every process computes it alone and all their spans meet in one
trace. A context that does travel (an HTTP ``traceparent``, the NATS headers of a log
event, gRPC metadata) wins over the derived one.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.util.types import AttributeValue

TRACER_NAME = "gpushare"

POD = "k8s.pod.name"
NAMESPACE = "k8s.namespace.name"
POD_UID = "k8s.pod.uid"
NODE = "k8s.node.name"

_tracer = trace.get_tracer(TRACER_NAME)
"""A proxy: it starts recording once :func:`~gpushare.telemetry.tracing.configure_tracing`
installed a provider, and is the API's no-op until then."""


def pod_span_context(uid: str) -> trace.SpanContext:
    """The pod root every service parents on: derived from ``uid`` alone."""
    digest = hashlib.sha256(uid.encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace.SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )


def pod_trace_id(uid: str) -> str:
    """The pod's trace id as 32 hex digits (what Tempo or Jaeger search for)."""
    return trace.format_trace_id(pod_span_context(uid).trace_id)


@functools.lru_cache(maxsize=4096)
def pod_context(uid: str) -> Context:
    """The context holding the pod root (remembered: a pod's verbs and events come
    close together, and a context is immutable)."""
    return trace.set_span_in_context(trace.NonRecordingSpan(pod_span_context(uid)))


def parent_for(uid: str | None, incoming: Context | None = None) -> Context | None:
    """``incoming`` if it has a span, else the current context if it has one, else the pod's.

    ``None`` means "the current context" to the tracer.
    """
    if incoming is not None and trace.get_current_span(incoming).get_span_context().is_valid:
        return incoming
    if trace.get_current_span().get_span_context().is_valid or not uid:
        return None
    return pod_context(uid)


def pod_attributes(namespace: str, name: str, uid: str) -> dict[str, AttributeValue]:
    return {NAMESPACE: namespace, POD: name, POD_UID: uid}


@contextmanager
def pod_span(
    name: str,
    uid: str | None,
    *,
    incoming: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
    start_time: int | None = None,
    tracer: Tracer | None = None,
) -> Iterator[Span]:
    """A current span in the pod's trace (see :func:`parent_for`); errors are recorded.

    With no tracer provider installed (nothing exports) the parent itself is made current,
    as the API's no-op tracer would, without its span machinery: log lines still name the
    pod's trace, at a quarter of the cost on every verb and event."""
    if tracer is None and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        parent = parent_for(uid, incoming)
        if parent is None:
            yield trace.get_current_span()
            return
        token = otel_context.attach(parent)
        try:
            yield trace.get_current_span(parent)
        finally:
            otel_context.detach(token)
        return
    with (tracer or _tracer).start_as_current_span(
        name,
        context=parent_for(uid, incoming),
        kind=kind,
        attributes=attributes,
        start_time=start_time,
    ) as span:
        yield span


def fail(span: Span, description: str) -> None:
    """Mark ``span`` failed with ``description`` (a verdict, not an exception)."""
    span.set_status(trace.Status(trace.StatusCode.ERROR, description))
