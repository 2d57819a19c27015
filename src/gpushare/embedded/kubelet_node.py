"""The test kubelet's node registration and status, as a real kubelet does it.

A kubelet creates its Node object if it is missing and reports what the machine offers
(``pods``: 110, ``cpu``, ``memory``) beside each device plugin's resources in
``status.capacity`` (all IDs) and ``status.allocatable`` (healthy IDs), with a ``Ready``
condition whose heartbeat it renews. kube-scheduler's NodeResourcesFit reads those: a
node that advertises no ``pods`` gets no pod ("Too many pods"), and a node whose plugin
has not registered yet is not offered pods that need the plugin's resource.

The test kubelet does not set ``status.nodeInfo`` (no kubelet version): that is how
``gpushare up`` tells the nodes it serves from those a real kubelet serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpushare.embedded.kubelet import EmbeddedKubelet

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
MAX_PODS = 110
"""The kubelet's default ``maxPods``."""
HEARTBEAT_SECONDS = 10.0
"""The kubelet's ``nodeStatusReportFrequency`` (at most 5 min; 10 s when it changes)."""
MEMINFO = Path("/proc/meminfo")
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
"""``uname -m`` to Go's ``GOARCH``, which ``kubernetes.io/arch`` holds."""


def machine_memory_kib(meminfo: Path = MEMINFO) -> int:
    """``MemTotal`` of this machine in KiB (what cAdvisor tells a real kubelet)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return 0


def machine_resources() -> dict[str, str]:
    """``cpu``, ``memory`` and ``pods``, as a real kubelet reports this machine."""
    return {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{machine_memory_kib()}Ki",
        "pods": str(MAX_PODS),
    }


def device_resources(kubelet: EmbeddedKubelet) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of every registered device plugin resource."""
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
    for resource in sorted(kubelet.known_resources):
        total, healthy = kubelet.device_counts(resource)
        capacity[resource] = str(total)
        allocatable[resource] = str(healthy)
    return capacity, allocatable


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(now: datetime, since: datetime) -> dict[str, str]:
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "gpushare test kubelet is posting ready status",
        "lastHeartbeatTime": _timestamp(now),
        "lastTransitionTime": _timestamp(since),
    }


def node_labels(name: str) -> dict[str, str]:
    """The well-known labels a real kubelet puts on its Node (and ``gpushare``)."""
    machine = platform.machine().lower()
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": ARCHITECTURES.get(machine, machine),
        "gpushare": "true",
    }


def status_body(
    machine: dict[str, str],
    devices: tuple[dict[str, str], dict[str, str]],
    now: datetime,
    since: datetime,
) -> dict[str, Any]:
    """The ``nodes/status`` strategic merge patch: capacity, allocatable, Ready."""
    capacity, allocatable = devices
    return {
        "status": {
            "capacity": {**machine, **capacity},
            "allocatable": {**machine, **allocatable},
            "conditions": [ready_condition(now, since)],
        }
    }


class NodeStatusReporter:
    """Keeps one node's Node object, its resources and its heartbeat up to date."""

    RETRY_SECONDS = 1.0

    def __init__(self, kubelet: EmbeddedKubelet, api_client: Any) -> None:
        from kubernetes.aio import client

        self.kubelet = kubelet
        self.api = client.CoreV1Api(api_client)
        self.machine = machine_resources()
        self._reported: tuple[dict[str, str], dict[str, str]] | None = None
        self._reported_at = 0.0
        self._ready_since = datetime.now(UTC)

    def _due(self) -> bool:
        stale = time.monotonic() - self._reported_at >= HEARTBEAT_SECONDS
        return stale or device_resources(self.kubelet) != self._reported

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.report()
            except Exception as error:  # the API is away: try again shortly
                log.warning("kubelet %s: node status: %s", self.kubelet.node, error)
                self._reported = None
            with contextlib.suppress(TimeoutError):
                await self.kubelet.wait_until(
                    lambda: stop.is_set() or self._due(), self.RETRY_SECONDS
                )

    async def report(self) -> None:
        from kubernetes.aio.client.exceptions import ApiException

        if not self._due():
            return
        resources = device_resources(self.kubelet)
        body = status_body(self.machine, resources, datetime.now(UTC), self._ready_since)
        try:
            await self.api.patch_node_status(self.kubelet.node, body)
        except ApiException as error:
            if error.status != 404:
                raise
            await self.register()
            await self.api.patch_node_status(self.kubelet.node, body)
        if resources != self._reported:
            log.info("kubelet %s: node allocatable %s", self.kubelet.node, resources[1])
        self._reported = resources
        self._reported_at = time.monotonic()

    async def register(self) -> None:
        from kubernetes.aio.client import V1Node, V1ObjectMeta

        labels = node_labels(self.kubelet.node)
        node = V1Node(metadata=V1ObjectMeta(name=self.kubelet.node, labels=labels))
        await self.api.create_node(node)
        log.info("kubelet %s: registered the Node object", self.kubelet.node)
