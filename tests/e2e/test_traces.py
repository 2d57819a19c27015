"""One pod, one trace: spans of the services running as separate processes.

Every service writes its finished spans as JSON lines (``GPUSHARE_TRACE_DUMP``); the
test reads all the files and rebuilds the pod's tree from the parent links.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.trace import format_span_id

from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.core.annotations import ASSIGNED
from gpushare.embedded.scheduler import ExtenderClient
from gpushare.telemetry.dumping import read_spans
from gpushare.telemetry.pods import POD_UID, pod_span_context, pod_trace_id
from gpushare.telemetry.tracing import DUMP
from tests.e2e.conftest import core_api, eventually, gpu_pod

Span = dict[str, Any]
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"

EXPECTED = {
    # span name: (service, name of the parent span, "pod root" for the derived root)
    "extender filter": ("gpushare-allocator", "pod root"),
    "extender bind": ("gpushare-allocator", "pod root"),
    "append PodReserved": ("gpushare-allocator", "extender bind"),
    "binder bind": ("gpushare-binder", "append PodReserved"),
    "kubernetes POST pods/binding": ("gpushare-binder", "binder bind"),
    "append PodBound": ("gpushare-binder", "binder bind"),
    "deviceplugin Allocate": ("gpushare-node-agent", "pod root"),
    "append ContainerAssigned": ("gpushare-node-agent", "deviceplugin Allocate"),
    "kubernetes PATCH pods": ("gpushare-binder", "pod root"),
}


def filter_with_traceparent(extender_url: str, pod: dict[str, Any]) -> None:
    """One filter call as a traced caller would make it: its ``traceparent`` wins."""
    body = json.dumps(ExtenderClient(extender_url).args(pod, ["gpu-a"])).encode()
    headers = {
        "Content-Type": "application/json",
        "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
    }
    request = urllib.request.Request(
        f"{extender_url}/filter", data=body, headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200


def spans_of(dump: Path, uid: str) -> Callable[[], list[Span]]:
    def read() -> list[Span]:
        return [span for span in read_spans(dump) if span["attributes"].get(POD_UID) == uid]

    return read


def test_a_pods_spans_from_every_service_form_one_tree(short_tmp: Path) -> None:
    dump = short_tmp / "spans"
    dump.mkdir()
    config = StackConfig(
        data_dir=short_tmp,
        nodes=[parse_node("gpu-a=16276,16276"), parse_node("gpu-b=16276")],
        extender_port=0,
        extra_env={DUMP: str(dump), "OTEL_TRACES_EXPORTER": "none"},
    )
    with Stack(config).start(timeout=90) as stack:
        api, serialize = core_api(stack)
        pod = serialize(api.create_namespaced_pod("default", gpu_pod("traced", 10000)))
        uid = pod["metadata"]["uid"]

        result = ExtenderClient(stack.extender_url).schedule(pod, ["gpu-a", "gpu-b"])

        assert result.error == ""

        def assigned() -> bool:
            meta = api.read_namespaced_pod("traced", "default").metadata
            return bool(meta.annotations.get(ASSIGNED) == "true")

        eventually(assigned, "the device plugin's assignment")
        spans = spans_of(dump, uid)
        try:
            eventually(lambda: set(EXPECTED) <= {span["name"] for span in spans()}, "every span")
        except AssertionError:
            written = [(span["service"], span["name"]) for span in read_spans(dump)]
            missing = set(EXPECTED) - {name for _, name in written}
            raise AssertionError(f"missing {missing}; written {written}") from None
        pod_spans = spans()

        filter_with_traceparent(stack.extender_url, pod)
        eventually(lambda: any(s["trace_id"] == CALLER_TRACE for s in spans()), "its span")

    by_name = {span["name"]: span for span in pod_spans}
    by_id = {span["span_id"]: span for span in pod_spans}
    root_id = format_span_id(pod_span_context(uid).span_id)
    assert {span["trace_id"] for span in pod_spans} == {pod_trace_id(uid)}
    for name, (service, parent) in EXPECTED.items():
        span = by_name[name]
        assert span["service"] == service, name
        if parent == "pod root":
            assert span["parent_span_id"] == root_id, name
            assert span["parent_remote"], name
        else:
            assert by_id[span["parent_span_id"]]["name"] == parent, name
    assert by_name["extender filter"]["attributes"]["gpushare.nodes.passed"] == 2
    assert by_name["extender filter"]["attributes"]["gpushare.nodes.candidates"] == 2
    # filter chose the node (the allocator's default): kube-scheduler made no prioritize call
    assert by_name["extender filter"]["attributes"]["gpushare.nodes.best"] == result.node
    assert "extender prioritize" not in by_name
    assert by_name["extender bind"]["attributes"]["k8s.node.name"] == result.node
    assert by_name["kubernetes POST pods/binding"]["attributes"]["gpushare.bind.result"] == "bound"
    allocate = by_name["deviceplugin Allocate"]["attributes"]
    assert allocate["k8s.container.name"] == "main"
    assert all(span["status"] != "ERROR" for span in pod_spans)
    (called,) = [span for span in spans() if span["trace_id"] == CALLER_TRACE]
    assert called["name"] == "extender filter"
    assert (called["trace_id"], called["parent_span_id"]) == (CALLER_TRACE, CALLER_SPAN)
