"""Log records carry the trace id of the pod they are about."""

from __future__ import annotations

import json
import logging

from gpushare.logs import JsonFormatter, TraceIdFilter
from gpushare.telemetry.pods import pod_span, pod_trace_id


def formatted(message: str) -> dict[str, str]:
    record = logging.LogRecord("gpushare.test", logging.INFO, __file__, 1, message, None, None)
    TraceIdFilter().filter(record)
    return dict(json.loads(JsonFormatter().format(record)))


def test_a_line_inside_a_pods_span_names_the_pods_trace() -> None:
    with pod_span("binder bind", "uid-web"):
        entry = formatted("bound")
    assert entry["trace_id"] == pod_trace_id("uid-web")
    assert entry["message"] == "bound"


def test_a_line_outside_any_span_has_no_trace_id() -> None:
    assert "trace_id" not in formatted("started")
