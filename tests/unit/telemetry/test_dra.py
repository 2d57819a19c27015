"""The spans of the DRA front door join the trace of the claim's pod."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from gpushare.telemetry.dra import claim_span
from gpushare.telemetry.pods import pod_span_context


def test_a_claims_span_is_in_its_pods_trace(tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    with claim_span(
        "prepare",
        claim="ml/infer-gpu",
        node="gpu-a",
        pod=("ml", "infer", "uid-1"),
        cards=("GPU-1",),
        memory_mib=4096,
        tracer=tracer,
    ):
        pass
    with claim_span("released", claim="ml/orphan", node="gpu-a", pod=None, tracer=tracer):
        pass
    prepared, released = exporter.get_finished_spans()
    assert prepared.name == "dra prepare"
    assert prepared.context is not None
    assert prepared.context.trace_id == pod_span_context("uid-1").trace_id
    attributes = dict(prepared.attributes or {})
    assert attributes["gpushare.claim"] == "ml/infer-gpu"
    assert (attributes["k8s.pod.name"], attributes["gpushare.memory_mib"]) == ("infer", 4096)
    assert released.parent is None  # a claim no pod holds: a trace of its own
