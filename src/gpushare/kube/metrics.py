"""Latency and failures of Kubernetes API calls, in the process-wide registry.

Counted by :class:`~gpushare.kube.client.KubeClient` for every call, labelled with the
client method's name (``create_namespaced_pod_binding``, ``patch_namespaced_pod``...),
a small fixed set. The binder serves them on its ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

API_SECONDS = Histogram(
    "gpushare_kube_api_request_seconds",
    "Time of one Kubernetes API call (watches excluded), by client method.",
    ["call"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
API_ERRORS = Counter(
    "gpushare_kube_api_errors",
    "Kubernetes API calls that failed, by client method and error (the mapped error "
    "class, or http_<status> for an unparsed answer).",
    ["call", "error"],
)


def call_name(method: object) -> str:
    return str(getattr(method, "__name__", "unknown"))
