"""Setting up the tracer provider of one process from the standard ``OTEL_*`` variables.

``OTEL_TRACES_EXPORTER`` names the exporters (``otlp``, ``console``, ``none``; comma
separated). Left unset, OTLP is used only when an ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its
traces variant) is set, so a process nobody asked to trace keeps the API's no-op tracer
and pays nothing. The OTLP/HTTP exporter reads its own settings (endpoint, headers,
timeout, compression) from the environment; ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` name the resource; ``OTEL_SDK_DISABLED=true`` turns it off.
``GPUSHARE_TRACE_DUMP=DIR`` also writes every finished span as a JSON line to a file of
its own in ``DIR`` (tests read the spans of several processes that way).

Nothing here ever raises into a service: an exporter that cannot be built, or that fails
to export, is logged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from gpushare.telemetry.dumping import JsonLinesExporter

log = logging.getLogger(__name__)

DUMP = "GPUSHARE_TRACE_DUMP"
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` asks for (unset: ``otlp`` if an endpoint is)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER")
    if raw is None:
        return ["otlp"] if any(environ.get(name) for name in ENDPOINTS) else []
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    return [name for name in names if name != "none"]


def _exporter(name: str) -> SpanExporter | None:
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if name == "console":
        return ConsoleSpanExporter()
    log.warning("unknown OTEL_TRACES_EXPORTER %r ignored (otlp, console, none)", name)
    return None


def _processors(environ: Mapping[str, str], service_name: str) -> list[SpanProcessor]:
    processors: list[SpanProcessor] = []
    for name in exporter_names(environ):
        try:
            exporter = _exporter(name)
        except Exception:
            log.exception("cannot set up the %s trace exporter; not exporting there", name)
            continue
        if exporter is not None:
            processors.append(BatchSpanProcessor(exporter))
    dump = environ.get(DUMP)
    if dump:
        path = os.path.join(dump, f"{service_name}-{os.getpid()}.jsonl")
        processors.append(SimpleSpanProcessor(JsonLinesExporter(path)))
    return processors


def resource_for(service_name: str) -> Resource:
    """``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` win over ``service_name``."""
    resource = Resource.create()
    named = str(resource.attributes.get(SERVICE_NAME, ""))
    if named and not named.startswith("unknown_service"):
        return resource
    return resource.merge(Resource({SERVICE_NAME: service_name}))


def build_provider(service_name: str) -> TracerProvider | None:
    """The provider the environment asks for; ``None`` when nothing would export."""
    try:
        processors = _processors(os.environ, service_name)
        if not processors:
            return None
        provider = TracerProvider(resource=resource_for(service_name))
        for processor in processors:
            provider.add_span_processor(processor)
    except Exception:
        log.exception("cannot set up tracing; running without it")
        return None
    return provider


def configure_tracing(service_name: str) -> TracerProvider | None:
    """Install this process's tracer provider; ``None`` (the no-op API) when nothing exports."""
    provider = build_provider(service_name)
    if provider is None:
        return None
    trace.set_tracer_provider(provider)
    log.info("tracing %s", service_name)
    return provider
