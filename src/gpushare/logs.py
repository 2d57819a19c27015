"""Logging set-up shared by every process: plain lines on a terminal, JSON in containers."""

from __future__ import annotations

import json
import logging
import os
import sys

from opentelemetry import trace


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("node", "pod", "trace_id"):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TraceIdFilter(logging.Filter):
    """Stamps each record with the trace id of the current span (a pod's trace: the one
    Tempo shows for it), so a log line leads to its trace and back."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is None:
            context = trace.get_current_span().get_span_context()
            if context.is_valid:
                record.trace_id = trace.format_trace_id(context.trace_id)
        return True


def setup_logging(service: str) -> None:
    """``GPUSHARE_LOG_LEVEL`` (default info) and ``GPUSHARE_LOG_FORMAT`` (text|json)."""
    level = os.environ.get("GPUSHARE_LOG_LEVEL", "info").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TraceIdFilter())
    if os.environ.get("GPUSHARE_LOG_FORMAT", "text") == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
        )
    logging.basicConfig(level=level, handlers=[handler], force=True)
