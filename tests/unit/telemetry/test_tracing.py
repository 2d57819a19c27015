"""Which exporters the OTEL_* variables turn on, and the JSON lines the tests read back."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.resources import SERVICE_NAME
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from gpushare.telemetry.dumping import read_spans
from gpushare.telemetry.pods import pod_span, pod_span_context, pod_trace_id
from gpushare.telemetry.tracing import DUMP, build_provider, exporter_names, resource_for

OTEL_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    DUMP,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://tempo:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, []),
        ({"OTEL_TRACES_EXPORTER": "Console, otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_exporters_follow_the_standard_variables(environ: dict[str, str], names: list[str]) -> None:
    assert exporter_names(environ) == names


def test_nothing_configured_means_no_provider() -> None:
    assert build_provider("gpushare-binder") is None


def test_otlp_gets_a_batch_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")

    provider = build_provider("gpushare-binder")

    assert provider is not None
    processors = provider._active_span_processor._span_processors
    assert [type(processor) for processor in processors] == [BatchSpanProcessor]
    provider.shutdown()


def test_an_unknown_exporter_is_skipped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")

    assert build_provider("gpushare-binder") is None
    assert "unknown OTEL_TRACES_EXPORTER 'zipkin'" in caplog.text


def test_the_service_name_is_a_default_the_environment_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert resource_for("gpushare-binder").attributes[SERVICE_NAME] == "gpushare-binder"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=binder-eu,deployment=prod")
    resource = resource_for("gpushare-binder")
    assert resource.attributes[SERVICE_NAME] == "binder-eu"
    assert resource.attributes["deployment"] == "prod"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "binder-us")
    assert resource_for("gpushare-binder").attributes[SERVICE_NAME] == "binder-us"


def test_the_dump_writes_each_span_as_it_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(DUMP, str(tmp_path))
    provider = build_provider("gpushare-node-agent")
    assert provider is not None
    processors = provider._active_span_processor._span_processors
    assert [type(processor) for processor in processors] == [SimpleSpanProcessor]
    tracer = provider.get_tracer("test")

    with pod_span(
        "deviceplugin Allocate",
        "uid-1",
        kind=SpanKind.SERVER,
        attributes={"k8s.container.name": "main"},
        tracer=tracer,
    ):
        with pod_span("append ContainerAssigned", "uid-1", tracer=tracer):
            pass
        written = list(read_spans(tmp_path))  # before the provider is shut down

    assert [span["name"] for span in written] == ["append ContainerAssigned"]
    spans = list(read_spans(tmp_path))
    allocate = spans[1]
    assert allocate["name"] == "deviceplugin Allocate"
    assert allocate["service"] == "gpushare-node-agent"
    assert allocate["kind"] == "SERVER"
    assert allocate["trace_id"] == pod_trace_id("uid-1")
    assert int(allocate["parent_span_id"], 16) == pod_span_context("uid-1").span_id
    assert allocate["parent_remote"]
    assert allocate["attributes"] == {"k8s.container.name": "main"}
    assert spans[0]["parent_span_id"] == allocate["span_id"]
    assert not spans[0]["parent_remote"]
    provider.shutdown()
