"""Spans of the device plugin's ``Allocate``, in the trace of the pod it turns out to be for.

A real kubelet sends no trace context, and an ``Allocate`` names device IDs, not a
pod: which pod it serves is known only once the IDs are matched to a bound container.
So :func:`allocate_call` notes when the call began (and attaches the context of its
gRPC metadata, when a caller did send one); :func:`allocate_span` opens the span at
that moment, once the pod is known, parented on the metadata's context or else on the
pod's root. The ``ContainerAssigned`` append happens inside it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.util.types import AttributeValue

from gpushare.telemetry.pods import NODE, fail, pod_attributes, pod_span
from gpushare.telemetry.propagation import attached, extract_metadata

RPC_SYSTEM = "rpc.system"
RPC_SERVICE = "rpc.service"
RPC_METHOD = "rpc.method"
REASON = "gpushare.reason"
RESOURCE = "gpushare.resource"
CONTAINER = "k8s.container.name"
DEVICE_IDS = "gpushare.device_ids"
CARDS = "gpushare.cards"

_started: ContextVar[int | None] = ContextVar("gpushare_allocate_started", default=None)


@contextmanager
def allocate_call(metadata: Iterable[tuple[str, str | bytes]] | None) -> Iterator[None]:
    """Around one ``Allocate`` call: its start time, and the caller's context if any."""
    token = _started.set(time.time_ns())
    try:
        with attached(extract_metadata(metadata)):
            yield
    finally:
        _started.reset(token)


@contextmanager
def allocate_span(
    *,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    container: str,
    resource: str,
    device_ids: int,
    cards: Iterable[str],
) -> Iterator[Span]:
    """The span of the ``Allocate`` matched to container ``container`` of pod ``uid``."""
    attributes = {
        **pod_attributes(namespace, name, uid),
        **_call_attributes(node, resource, device_ids),
        CONTAINER: container,
        CARDS: ",".join(cards),
    }
    with _allocate_span(uid, attributes) as span:
        yield span


def allocate_refused(
    *, node: str, resource: str, device_ids: int, reason: str, tracer: Tracer | None = None
) -> None:
    """The span of an ``Allocate`` no bound container matched: it belongs to no pod, so it
    starts a trace of its own (or joins the caller's), failed with the reason the kubelet
    shows as ``UnexpectedAdmissionError``: what an operator searches Tempo for."""
    attributes = {**_call_attributes(node, resource, device_ids), REASON: reason}
    with _allocate_span(None, attributes, tracer) as span:
        fail(span, reason)


def _call_attributes(node: str, resource: str, device_ids: int) -> dict[str, AttributeValue]:
    return {
        NODE: node,
        RESOURCE: resource,
        DEVICE_IDS: device_ids,
        RPC_SYSTEM: "grpc",
        RPC_SERVICE: "v1beta1.DevicePlugin",
        RPC_METHOD: "Allocate",
    }


def _allocate_span(
    uid: str | None, attributes: dict[str, AttributeValue], tracer: Tracer | None = None
) -> AbstractContextManager[Span]:
    """Opened once the call's pod is known (or known to be none), dated from its arrival."""
    return pod_span(
        "deviceplugin Allocate",
        uid,
        kind=SpanKind.SERVER,
        attributes=attributes,
        start_time=_started.get(),
        tracer=tracer,
    )
