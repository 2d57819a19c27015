"""The device plugin gRPC service the kubelet calls (``v1beta1.DevicePlugin``).

One instance serves one resource (one socket): ``aliyun.com/gpu-mem``,
``gpushare.io/gpu-core``, ... (:mod:`.resources`).

* ``ListAndWatch`` streams the node's whole device list, again on every change.
* ``GetPreferredAllocation`` advises the IDs of the cards the log chose for the earliest
  waiting container of that size, so the kubelet's otherwise arbitrary pick lands there.
* ``Allocate`` matches the IDs to a bound container keyed on this resource
  (:mod:`.matching`), records the match as ``ContainerAssigned`` (acknowledged by
  JetStream before answering) and returns the container's environment
  (:func:`gpushare.core.environment.container_environment`: every card it got, limits
  and, on an MPS node, MPS's variables). A call for a resource the container asked only
  besides its keyed one is answered with an empty response: the kubelet merges the
  responses of all a container's resources, and the keyed one carries everything.
  With no match it fails ``FAILED_PRECONDITION`` with the reason, which the kubelet
  puts into the pod's admission error.

When the log is a moment behind the kubelet (the binder appends ``PodBound`` right
after the API accepted the binding), a call that finds nothing reads the node's
newest events and waits up to ``match_wait_seconds`` for the fold before giving up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import TypeVar

import grpc

from gpushare.bus.log import AllocationLog
from gpushare.core.environment import container_environment
from gpushare.core.events import ContainerAssigned
from gpushare.core.requests import GPU_MEM
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node_agent import metrics
from gpushare.node_agent.devices import DeviceTable
from gpushare.node_agent.matching import (
    CountOnly,
    Match,
    NoMatch,
    fallback_ids,
    match_allocate,
    preferred_ids,
)
from gpushare.node_agent.view import NodeView
from gpushare.telemetry.deviceplugin import allocate_call, allocate_refused, allocate_span

log = logging.getLogger(__name__)

T = TypeVar("T")


def assignment_id(match: Match) -> str:
    """The same container of the same reservation is always the same event."""
    return f"assigned-{match.allocation.reservation_id}-{match.share.container}"


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource of one node; the same instance survives re-registrations."""

    def __init__(
        self,
        view: NodeView,
        allocation_log: AllocationLog,
        match_wait_seconds: float = 5.0,
        on_assigned: Callable[[], None] | None = None,
        resource: str = GPU_MEM,
    ) -> None:
        self.view = view
        self.log = allocation_log
        self.match_wait_seconds = match_wait_seconds
        self.on_assigned = on_assigned
        self.resource = resource

    @property
    def table(self) -> DeviceTable:
        return self.view.tables[self.resource]

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        version = -1
        log.info("node %s: kubelet opened ListAndWatch of %s", self.view.name, self.resource)
        while True:
            version = await self.view.wait_devices(version)
            yield self.view.responses[self.resource]

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        answers = [await self._prefer(container) for container in request.container_requests]
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in answers
            ]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        with allocate_call(context.invocation_metadata()):
            return await self._allocate_all(request, context)

    async def _allocate_all(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        responses = []
        for container in request.container_requests:
            try:
                outcome = await self._allocate(list(container.devices_ids))
            except Exception:
                metrics.ALLOCATIONS.labels(node=self.view.name, outcome="error").inc()
                raise
            if isinstance(outcome, NoMatch):
                metrics.ALLOCATIONS.labels(node=self.view.name, outcome="refused").inc()
                log.warning("node %s: Allocate refused: %s", self.view.name, outcome.reason)
                allocate_refused(
                    node=self.view.name,
                    resource=self.resource,
                    device_ids=len(container.devices_ids),
                    reason=outcome.reason,
                )
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, outcome.reason)
                return api_pb2.AllocateResponse()  # not reached: abort raises
            responses.append(outcome)
        metrics.ALLOCATIONS.labels(node=self.view.name, outcome="assigned").inc()
        if self.on_assigned is not None:
            self.on_assigned()
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    async def _prefer(self, request: api_pb2.ContainerPreferredAllocationRequest) -> list[str]:
        available = list(request.available_deviceIDs)
        must = list(request.must_include_deviceIDs)
        size = int(request.allocation_size)
        view = self.view
        log.debug(
            "node %s: GetPreferredAllocation size=%d must=%s available=%d IDs",
            view.name,
            size,
            must,
            len(available),
        )
        chosen = await self._decide(
            lambda: preferred_ids(
                view.node,
                self.table,
                view.claimed,
                available=available,
                must_include=must,
                size=size,
                asks=view.asks,
            )
        )
        metrics.PREFERRED.labels(view.name, "fallback" if chosen is None else "matched").inc()
        if chosen is None:
            chosen = fallback_ids(self.table, available, must, size)
            log.warning(
                "node %s: no waiting container of %d %s; advising %s",
                view.name,
                size,
                view.memory_unit if self.resource == GPU_MEM else self.resource,
                _summary(chosen),
            )
        return list(chosen)

    async def _allocate(self, device_ids: list[str]) -> api_pb2.ContainerAllocateResponse | NoMatch:
        view = self.view

        def decide() -> Match | CountOnly | NoMatch:
            return match_allocate(view.node, self.table, view.claimed, device_ids, view.asks)

        def decided() -> Match | CountOnly | None:
            return _as_optional(decide())

        found: Match | CountOnly | None = await self._decide(decided)
        outcome = found or decide()
        if isinstance(outcome, NoMatch):
            return outcome
        if isinstance(outcome, CountOnly):
            log.info(
                "node %s: %s container %r: %d %s IDs counted (its cards come with %s)",
                view.name,
                outcome.allocation.pod.key,
                outcome.container,
                len(device_ids),
                self.resource,
                outcome.keyed,
            )
            return api_pb2.ContainerAllocateResponse()
        view.claimed.add(outcome.claim)  # before any await: the next call must not pick it
        try:
            await self._record(outcome, device_ids)
        except Exception as error:
            view.claimed.discard(outcome.claim)
            log.error("node %s: could not record the assignment: %s", view.name, error)
            return NoMatch(f"could not record the assignment in the allocation log: {error}")
        envs = container_environment(
            outcome.shares,
            {card.uuid: card for card in outcome.cards},
            pod_memory_mib=outcome.allocation.memory_mib,
            memory_unit=view.memory_unit,
            mps=view.node.mps,
            aliyun=view.asks.aliyun(*outcome.claim),
        )
        return api_pb2.ContainerAllocateResponse(envs=envs)

    async def _record(self, match: Match, device_ids: list[str]) -> None:
        event = ContainerAssigned(
            id=assignment_id(match),
            at=datetime.now(UTC),
            node=self.view.name,
            pod=match.allocation.pod,
            reservation_id=match.allocation.reservation_id,
            container=match.share.container,
            card_uuids=tuple(card.uuid for card in match.cards),
            device_ids=tuple(device_ids),
        )
        pod = match.allocation.pod
        with allocate_span(
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            node=self.view.name,
            container=match.share.container,
            resource=self.resource,
            device_ids=len(device_ids),
            cards=event.card_uuids,
        ):
            seq = await self.log.append(event)
        log.info(
            "node %s: %s container %r gets %s (%d %s IDs), seq %d",
            self.view.name,
            match.allocation.pod.key,
            match.share.container,
            ", ".join(event.card_uuids),
            len(device_ids),
            self.resource,
            seq,
        )

    async def _decide(self, decide: Callable[[], T | None]) -> T | None:
        """``decide()`` now; else after reading the log, and on each change until the wait ends.

        Returns synchronously after a successful ``decide()``, so the caller can claim
        the result before anything else runs.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.match_wait_seconds
        caught_up = False
        while True:
            version = self.view.version
            result = decide()
            if result is not None:
                return result
            if not caught_up:
                caught_up = True
                await self.view.catch_up()
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            await self.view.wait_changed(version, remaining)


def _as_optional(outcome: Match | CountOnly | NoMatch) -> Match | CountOnly | None:
    return None if isinstance(outcome, NoMatch) else outcome


def _summary(ids: tuple[str, ...]) -> str:
    if len(ids) <= 4:
        return ", ".join(ids) or "nothing"
    return f"{ids[0]} … {ids[-1]} ({len(ids)} IDs)"
