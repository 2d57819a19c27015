"""One node's agent: its view of the log, the device plugin, registration, the check.

``__main__`` runs one :class:`NodeAgent` per ``--node``; tests build them directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from gpushare.bus.log import AllocationLog
from gpushare.bus.nats_types import Client, JetStreamContext
from gpushare.node_agent.device_table import HEALTHY
from gpushare.node_agent.dra_plugin import DraEndpoint, DraPluginService
from gpushare.node_agent.kubelet_lists import KubeletLists
from gpushare.node_agent.local_node import LocalNode
from gpushare.node_agent.plugin import DevicePluginService
from gpushare.node_agent.podresources import PodResourcesCheck
from gpushare.node_agent.readiness import ReadinessResponder
from gpushare.node_agent.registration import PluginEndpoint
from gpushare.node_agent.settings import AgentSettings, NodeTarget
from gpushare.tasks import supervised

log = logging.getLogger(__name__)


class NodeAgent:
    """Everything the agent does for one node, started and stopped together."""

    def __init__(
        self,
        js: JetStreamContext,
        target: NodeTarget,
        settings: AgentSettings,
        nc: Client | None = None,
    ) -> None:
        self.target = target
        self.settings = settings
        self.view = LocalNode(js, target.name, settings.memory_unit, settings.resources)
        allocation_log = AllocationLog(js)
        self.check = PodResourcesCheck(
            self.view,
            target.pod_resources,
            settings.resources,
            settings.reconcile_interval_seconds,
            allocation_log=allocation_log,
            checkpoint=target.checkpoint,
            at_start=settings.reconcile_at_start,
            missing_grace_seconds=settings.missing_grace_seconds,
        )
        self.lists = KubeletLists(target.name, target.pod_resources)
        """Which registrations' device lists the kubelet has processed (not only been sent)."""
        self.services = {
            resource: DevicePluginService(
                self.view,
                allocation_log,
                match_wait_seconds=settings.match_wait_seconds,
                on_assigned=self.check.poke if settings.reconcile_after_allocate else None,
                resource=resource,
                pod_resources=target.pod_resources,
                on_list_sent=self.lists.list_sent,
            )
            for resource in settings.resources
        }
        self.endpoints = {
            resource: PluginEndpoint(
                target,
                service,
                resource,
                poll_seconds=settings.registration_poll_seconds,
                retry_seconds=settings.register_retry_seconds,
                socket=target.socket_of(resource),
            )
            for resource, service in self.services.items()
        }
        self.dra = (
            DraEndpoint(
                target,
                DraPluginService(
                    self.view, settings.cdi_dir, wait_seconds=settings.match_wait_seconds
                ),
                poll_seconds=settings.registration_poll_seconds,
            )
            if settings.front_door == "dra"
            else None
        )
        """The DRA kubelet plugin, on a node served through DRA (None elsewhere)."""
        self.readiness = ReadinessResponder(nc, target.name, self.serving) if nc else None
        """Answers the binder's "can this node admit our pods now?" (None: nobody asks)."""
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def service(self) -> DevicePluginService:
        """The first resource's service (``aliyun.com/gpu-mem`` unless not advertised)."""
        return next(iter(self.services.values()))

    @property
    def endpoint(self) -> PluginEndpoint:
        return next(iter(self.endpoints.values()))

    async def start(self) -> None:
        """Fold the node's log, then serve and register in the background; each loop runs
        supervised (a crash is logged and the loop runs again)."""
        await self.view.start()
        node = self.target.name
        loops: dict[str, Callable[[], Awaitable[None]]] = {
            f"registration of {resource}": partial(endpoint.run, self._stop)
            for resource, endpoint in self.endpoints.items()
        }
        loops["pod-resources check"] = partial(self.check.run, self._stop)
        loops["kubelet lists"] = partial(self.lists.run, self._stop, self._lists_sent)
        if self.dra is not None:
            loops["DRA plugin"] = partial(self.dra.run, self._stop)
        self._tasks = [
            asyncio.create_task(
                supervised(f"node {node}: {what}", loop, log), name=f"{what}-{node}"
            )
            for what, loop in loops.items()
        ]
        if self.readiness is not None:
            await self.readiness.start()
        log.info("node %s: node agent started", self.target.name)

    async def stop(self) -> None:
        if self.readiness is not None:
            await self.readiness.stop()
        self._stop.set()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("node %s: task ended with %r", self.target.name, result)
        self._tasks = []
        await self.view.stop()

    def serving(self) -> bool:
        """Whether the kubelet can allocate every resource now: each one registered with
        the kubelet that runs, and its device list sent over ``ListAndWatch`` and taken
        by the kubelet's device manager (:mod:`.kubelet_lists`)."""
        sent = self._lists_sent()
        return all(
            endpoint.registered_now
            and self.services[resource].watching > 0
            and (resource not in sent or self.lists.has_taken(resource, sent[resource]))
            for resource, endpoint in self.endpoints.items()
        )

    def _lists_sent(self) -> dict[str, int]:
        """Resource → its current registration, for each resource whose device list went
        to the kubelet that runs with healthy devices in it (a list without any cannot
        make the kubelet's allocatable set say anything)."""
        return {
            resource: endpoint.registrations
            for resource, endpoint in self.endpoints.items()
            if endpoint.registered_now
            and self.services[resource].watching > 0
            and any(device.health == HEALTHY for device in self.view.responses[resource].devices)
        }

    def inspect(self) -> dict[str, Any]:
        return {
            **self.view.inspect(),
            "registrations": self.endpoint.registrations,
            "serving": self.serving(),
            "lists_taken": dict(self.lists.taken),
            "registrations_by_resource": {
                resource: endpoint.registrations for resource, endpoint in self.endpoints.items()
            },
            "pod_resources": self.check.inspect(),
            "dra": None
            if self.dra is None
            else {
                "registered": self.dra.registration.registered,
                "error": self.dra.registration.error,
                "prepared": sorted(self.dra.service.prepared),
            },
        }
