"""The test kubelet's node registration and status, as a real kubelet does it.

A kubelet creates its Node object if it is missing and reports each device plugin's
resources in ``status.capacity`` (all IDs) and ``status.allocatable`` (healthy IDs).
kube-scheduler's NodeResourcesFit reads those, so a node whose plugin has not
registered yet is not offered pods that need the plugin's resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpushare.embedded.kubelet import EmbeddedKubelet

log = logging.getLogger(__name__)

HEALTHY = "Healthy"


def device_resources(kubelet: EmbeddedKubelet) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of every registered device plugin resource."""
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
    for resource in sorted(kubelet.known_resources):
        devices = kubelet.devices(resource)
        capacity[resource] = str(len(devices))
        allocatable[resource] = str(sum(health == HEALTHY for health in devices.values()))
    return capacity, allocatable


class NodeStatusReporter:
    """Keeps one node's Node object and its device resources up to date."""

    RETRY_SECONDS = 1.0

    def __init__(self, kubelet: EmbeddedKubelet, api_client: Any) -> None:
        from kubernetes.aio import client

        self.kubelet = kubelet
        self.api = client.CoreV1Api(api_client)
        self._reported: tuple[dict[str, str], dict[str, str]] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.report()
            except Exception as error:  # the API is away: try again shortly
                log.warning("kubelet %s: node status: %s", self.kubelet.node, error)
                self._reported = None
            with contextlib.suppress(TimeoutError):
                await self.kubelet.wait_until(
                    lambda: stop.is_set() or device_resources(self.kubelet) != self._reported,
                    self.RETRY_SECONDS,
                )

    async def report(self) -> None:
        from kubernetes.aio.client.exceptions import ApiException

        resources = device_resources(self.kubelet)
        if resources == self._reported:
            return
        capacity, allocatable = resources
        body = {"status": {"capacity": capacity, "allocatable": allocatable}}
        try:
            await self.api.patch_node_status(self.kubelet.node, body)
        except ApiException as error:
            if error.status != 404:
                raise
            await self.register()
            await self.api.patch_node_status(self.kubelet.node, body)
        self._reported = resources
        log.info("kubelet %s: node allocatable %s", self.kubelet.node, allocatable)

    async def register(self) -> None:
        from kubernetes.aio.client import V1Node, V1ObjectMeta

        labels = {"kubernetes.io/hostname": self.kubelet.node, "gpushare": "true"}
        node = V1Node(metadata=V1ObjectMeta(name=self.kubelet.node, labels=labels))
        await self.api.create_node(node)
        log.info("kubelet %s: registered the Node object", self.kubelet.node)
