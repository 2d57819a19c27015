"""Spans of the DRA front door, in the trace of the pod a claim is for.

kube-scheduler allocates a claim without calling us, so a DRA pod's trace starts where
gpushare first sees it: the binder recording the allocation, then the kubelet plugin
preparing it. Both parent on the pod's root (:mod:`.pods`), so they meet in one trace
with anything else recorded about the pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.trace import Span, Tracer
from opentelemetry.util.types import AttributeValue

from gpushare.telemetry.pods import NODE, pod_attributes, pod_span

CLAIM = "gpushare.claim"
CARDS = "gpushare.cards"
MEMORY_MIB = "gpushare.memory_mib"


@contextmanager
def claim_span(
    operation: str,
    *,
    claim: str,
    node: str,
    pod: tuple[str, str, str] | None,
    cards: tuple[str, ...] = (),
    memory_mib: int = 0,
    tracer: Tracer | None = None,
) -> Iterator[Span]:
    """A span ``dra <operation>`` about ``claim`` (``namespace/name``) on ``node``, in the
    trace of ``pod`` (namespace, name, uid) when the claim names one."""
    attributes: dict[str, AttributeValue] = {CLAIM: claim, NODE: node, MEMORY_MIB: memory_mib}
    if cards:
        attributes[CARDS] = ",".join(cards)
    if pod is not None:
        attributes.update(pod_attributes(*pod))
    uid = pod[2] if pod else None
    with pod_span(f"dra {operation}", uid, attributes=attributes, tracer=tracer) as span:
        yield span
