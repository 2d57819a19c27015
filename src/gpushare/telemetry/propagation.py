"""Carrying trace context (W3C ``traceparent``) in HTTP headers, NATS headers, gRPC metadata.

The propagators are the globally configured ones (``OTEL_PROPAGATORS``, by default
W3C trace context and baggage), so whatever a collector expects is what travels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context

TRACEPARENT = "traceparent"


def inject_headers(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Add the current (or ``context``'s) trace context to HTTP or NATS ``headers``.

    Adds nothing when there is no valid span: no ``traceparent`` of zeros ever travels.
    """
    if trace.get_current_span(context).get_span_context().is_valid:
        propagate.inject(headers, context=context)


def extract_headers(headers: Mapping[str, str] | None) -> Context | None:
    """The remote context in HTTP or NATS ``headers``; ``None`` when they carry none."""
    if not headers:
        return None
    context = propagate.extract(headers)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def metadata_carrier(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """gRPC metadata (key, value) pairs as a header dict; binary (``-bin``) values skipped."""
    return {
        key.lower(): value
        for key, value in metadata or ()
        if isinstance(value, str) and not key.endswith("-bin")
    }


def extract_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Context | None:
    """The remote context in gRPC invocation metadata; ``None`` when it carries none."""
    return extract_headers(metadata_carrier(metadata))


def inject_metadata(context: Context | None = None) -> list[tuple[str, str]]:
    """gRPC metadata pairs carrying the current (or ``context``'s) trace context."""
    headers: dict[str, str] = {}
    inject_headers(headers, context)
    return sorted(headers.items())


@contextmanager
def attached(context: Context | None) -> Iterator[None]:
    """Make ``context`` current for the block (nothing changes when it is ``None``)."""
    if context is None:
        yield
        return
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)
