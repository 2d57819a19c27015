"""Spans of the binder's Kubernetes API calls (the only writes gpushare makes there)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.trace import Span, SpanKind

from gpushare.telemetry.pods import NODE, fail, pod_attributes, pod_span

METHOD = "http.request.method"
RESOURCE = "k8s.api.resource"
STATUS = "http.response.status_code"
RESULT = "gpushare.bind.result"


@contextmanager
def api_span(
    method: str,
    resource: str,
    *,
    namespace: str,
    name: str,
    uid: str,
    node: str | None = None,
) -> Iterator[Span]:
    """A ``CLIENT`` span for ``method`` on ``resource`` (``pods/binding``, ``pods``) of a pod,
    in the current trace or else the pod's."""
    attributes = {**pod_attributes(namespace, name, uid), METHOD: method, RESOURCE: resource}
    if node is not None:
        attributes[NODE] = node
    with pod_span(
        f"kubernetes {method} {resource}", uid, kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield span


def record_outcome(span: Span, result: str, status: int, message: str) -> None:
    """What the API answered: ``bound``, ``refused`` or ``temporary``, with the status."""
    span.set_attribute(RESULT, result)
    if status:
        span.set_attribute(STATUS, status)
    if result != "bound":
        fail(span, message or result)
