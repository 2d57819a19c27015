"""Spans of the extender's verbs: ``filter``, ``prioritize`` and ``bind`` of one pod.

Each is a ``SERVER`` span parented on the caller's ``traceparent`` when the HTTP
request had one, else on the pod's root (:mod:`.pods`): kube-scheduler's three calls
for a pod land in the pod's one trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry.trace import Span, SpanKind

from gpushare.telemetry.pods import NODE, pod_attributes, pod_span

CANDIDATES = "gpushare.nodes.candidates"
PASSED = "gpushare.nodes.passed"
FAILED = "gpushare.nodes.failed"
UNRESOLVABLE = "gpushare.nodes.unresolvable"
BEST = "gpushare.nodes.best"
BEST_SCORE = "gpushare.nodes.best_score"


@contextmanager
def verb_span(verb: str, namespace: str, name: str, uid: str, candidates: int) -> Iterator[Span]:
    """The span of ``filter`` or ``prioritize`` for one pod over ``candidates`` nodes."""
    attributes = {**pod_attributes(namespace, name, uid), CANDIDATES: candidates}
    with pod_span(f"extender {verb}", uid, kind=SpanKind.SERVER, attributes=attributes) as span:
        yield span


def record_verdicts(
    span: Span, passed: int, failed: Mapping[str, str], unresolvable: Mapping[str, str]
) -> None:
    if span.is_recording():
        span.set_attribute(PASSED, passed)
        span.set_attribute(FAILED, len(failed))
        span.set_attribute(UNRESOLVABLE, len(unresolvable))


def record_scores(span: Span, names: Sequence[str], scores: Sequence[int]) -> None:
    if span.is_recording() and names:
        best = max(range(len(names)), key=lambda index: scores[index])
        span.set_attribute(BEST, names[best])
        span.set_attribute(BEST_SCORE, scores[best])


@contextmanager
def bind_span(namespace: str, name: str, uid: str, node: str) -> Iterator[Span]:
    """The span of ``bind``: reserve in the log, wait for the binder's verdict."""
    attributes = {**pod_attributes(namespace, name, uid), NODE: node}
    with pod_span("extender bind", uid, kind=SpanKind.SERVER, attributes=attributes) as span:
        yield span
