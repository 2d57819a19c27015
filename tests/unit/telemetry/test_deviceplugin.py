"""The span of an ``Allocate`` the node agent refuses."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, Tracer

from gpushare.telemetry.deviceplugin import allocate_call, allocate_refused

REASON = "no bound pod on node gpu-a waits for 1024 MiB on GPU0; pending: none"


def test_a_refused_allocate_is_a_failed_span_of_its_own_with_the_reason(
    tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    with allocate_call(None):
        allocate_refused(
            node="gpu-a",
            resource="aliyun.com/gpu-mem",
            device_ids=1024,
            reason=REASON,
            tracer=tracer,
        )

    (span,) = exporter.get_finished_spans()
    assert span.name == "deviceplugin Allocate"
    assert span.parent is None  # no pod to join: a trace of its own
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == REASON
    attributes = dict(span.attributes or {})
    assert (attributes["k8s.node.name"], attributes["gpushare.reason"]) == ("gpu-a", REASON)
    assert attributes["gpushare.device_ids"] == 1024
