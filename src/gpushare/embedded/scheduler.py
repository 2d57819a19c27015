"""Calling the extender exactly as kube-scheduler does (extender/v1 over HTTP).

The demo and the end-to-end tests schedule pods through this: filter, then prioritize
when more than one node passed, then bind to the best-scored node, with the same JSON
(PascalCase keys, ``null`` for the unused field, the Pod without apiVersion/kind as an
informer holds it) and headers as the recorded kube-scheduler v1.36 calls.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

HEADERS = {
    "Content-Type": "application/json",
    "User-Agent": "Go-http-client/1.1",
    "Accept-Encoding": "gzip",
}


class ExtenderCallFailed(Exception):
    """The extender answered something other than HTTP 200 (kube-scheduler: an error)."""


@dataclass
class SchedulingResult:
    pod: str
    node: str | None
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    scores: dict[str, int] = field(default_factory=dict)
    error: str = ""


def informer_view(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod as kube-scheduler's informer cache holds it: no TypeMeta."""
    return {key: value for key, value in pod.items() if key not in {"apiVersion", "kind"}}


class ExtenderClient:
    """kube-scheduler's side of one extender; an ``https`` prefix is verified against
    ``ca_file`` (else the system roots) and presents ``cert_file``/``key_file`` if given,
    as kube-scheduler's extender ``tlsConfig`` (``caFile``, ``certFile``, ``keyFile``)."""

    def __init__(
        self,
        url_prefix: str,
        node_cache_capable: bool = True,
        timeout: float = 30,
        *,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ):
        self.url_prefix = url_prefix.rstrip("/")
        self.node_cache_capable = node_cache_capable
        self.timeout = timeout
        self.tls: ssl.SSLContext | None = None
        if self.url_prefix.startswith("https:"):
            self.tls = ssl.create_default_context(cafile=ca_file)
            if cert_file:
                self.tls.load_cert_chain(cert_file, key_file)

    def call(self, verb: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body, separators=(",", ":")).encode()
        request = urllib.request.Request(
            f"{self.url_prefix}/{verb}", data=data, headers=HEADERS, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.tls) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            raise ExtenderCallFailed(f"{verb}: HTTP {error.code}: {detail}") from None

    def args(self, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
        if self.node_cache_capable:
            return {"Pod": informer_view(pod), "Nodes": None, "NodeNames": nodes}
        items = [{"metadata": {"name": name}} for name in nodes]
        return {
            "Pod": informer_view(pod),
            "Nodes": {"metadata": {}, "items": items},
            "NodeNames": None,
        }

    def filter(self, pod: dict[str, Any], nodes: list[str]) -> tuple[list[str], dict[str, str]]:
        result = self.call("filter", self.args(pod, nodes))
        if result.get("Error"):
            raise ExtenderCallFailed(f"filter: {result['Error']}")
        if self.node_cache_capable:
            passed = list(result.get("NodeNames") or [])
        else:
            passed = [
                item["metadata"]["name"] for item in (result.get("Nodes") or {}).get("items") or []
            ]
        failed = {
            **(result.get("FailedNodes") or {}),
            **(result.get("FailedAndUnresolvableNodes") or {}),
        }
        return passed, failed

    def prioritize(self, pod: dict[str, Any], nodes: list[str]) -> dict[str, int]:
        result = self.call("prioritize", self.args(pod, nodes))
        return {entry["Host"]: int(entry["Score"]) for entry in result}

    def bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        body = {
            "PodName": meta["name"],
            "PodNamespace": meta.get("namespace", "default"),
            "PodUID": meta.get("uid", ""),
            "Node": node,
        }
        return str(self.call("bind", body).get("Error") or "")

    def schedule(self, pod: dict[str, Any], nodes: list[str]) -> SchedulingResult:
        """One scheduling cycle of kube-scheduler for ``pod`` over candidate ``nodes``."""
        name = f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"
        passed, failed = self.filter(pod, nodes)
        result = SchedulingResult(pod=name, node=None, passed=passed, failed=failed)
        if not passed:
            result.error = f"0/{len(nodes)} nodes are available"
            return result
        if len(passed) > 1:
            result.scores = self.prioritize(pod, passed)
        best = max(passed, key=lambda node: result.scores.get(node, 0))
        result.error = self.bind(pod, best)
        result.node = None if result.error else best
        return result
