"""Writing finished spans as JSON lines, one file per process, flushed span by span.

Used with ``GPUSHARE_TRACE_DUMP``: end-to-end tests run the services as processes, read
every file back (:func:`read_spans`) and check the trees. A process killed mid-test
loses nothing already ended.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import SERVICE_NAME
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, format_span_id, format_trace_id

log = logging.getLogger(__name__)


def _ids(context: SpanContext | None) -> dict[str, str | None]:
    if context is None:
        return {"trace_id": None, "span_id": None}
    return {
        "trace_id": format_trace_id(context.trace_id),
        "span_id": format_span_id(context.span_id),
    }


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """The parts of a span a test looks at, as plain JSON values."""
    return {
        "name": span.name,
        "service": span.resource.attributes.get(SERVICE_NAME),
        "kind": span.kind.name,
        **_ids(span.context),
        "parent_span_id": _ids(span.parent)["span_id"],
        "parent_remote": bool(span.parent and span.parent.is_remote),
        "links": [_ids(link.context) for link in span.links],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "start": span.start_time,
        "end": span.end_time,
    }


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span), default=str) + "\n" for span in spans)
        try:
            with self._lock, self._path.open("a", encoding="utf-8") as out:
                out.write(lines)
        except OSError as error:
            log.warning("cannot write spans to %s: %s", self._path, error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def read_spans(directory: str | Path) -> Iterator[dict[str, Any]]:
    """Every span written under ``directory`` by any process."""
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield json.loads(line)
