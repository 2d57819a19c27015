"""The device plugin gRPC service the kubelet calls (``v1beta1.DevicePlugin``).

* ``ListAndWatch`` streams the node's whole device list, again on every change.
* ``GetPreferredAllocation`` advises the IDs of the card the log chose for the earliest
  waiting container of that size, so the kubelet's otherwise arbitrary pick lands there.
* ``Allocate`` matches the IDs to a bound container (:mod:`.matching`), records the
  match as ``ContainerAssigned`` (acknowledged by JetStream before answering) and
  returns the container's environment. With no match it fails ``FAILED_PRECONDITION``
  with the reason, which the kubelet puts into the pod's admission error.

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
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node_agent import metrics
from gpushare.node_agent.matching import (
    Match,
    NoMatch,
    fallback_ids,
    match_allocate,
    preferred_ids,
)
from gpushare.node_agent.view import NodeView

log = logging.getLogger(__name__)

T = TypeVar("T")


def assignment_id(match: Match) -> str:
    """The same container of the same reservation is always the same event."""
    return f"assigned-{match.allocation.reservation_id}-{match.share.container}"


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """Serves one node; the same instance survives re-registrations with the kubelet."""

    def __init__(
        self,
        view: NodeView,
        allocation_log: AllocationLog,
        match_wait_seconds: float = 5.0,
        on_assigned: Callable[[], None] | None = None,
    ) -> None:
        self.view = view
        self.log = allocation_log
        self.match_wait_seconds = match_wait_seconds
        self.on_assigned = on_assigned

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
        log.info("node %s: kubelet opened ListAndWatch", self.view.name)
        while True:
            version = await self.view.wait_devices(version)
            yield self.view.response

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
        responses = []
        for container in request.container_requests:
            outcome = await self._allocate(list(container.devices_ids))
            if isinstance(outcome, NoMatch):
                metrics.ALLOCATIONS.labels(node=self.view.name, outcome="refused").inc()
                log.warning("node %s: Allocate refused: %s", self.view.name, outcome.reason)
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
                view.table,
                view.claimed,
                available=available,
                must_include=must,
                size=size,
            )
        )
        if chosen is None:
            chosen = fallback_ids(view.table, available, must, size)
            log.warning(
                "node %s: no waiting container of %d %s; advising %s",
                view.name,
                size,
                view.memory_unit,
                _summary(chosen),
            )
        return list(chosen)

    async def _allocate(self, device_ids: list[str]) -> api_pb2.ContainerAllocateResponse | NoMatch:
        view = self.view

        def decide() -> Match | NoMatch:
            return match_allocate(view.node, view.table, view.claimed, device_ids)

        outcome = await self._decide(lambda: _as_optional(decide())) or decide()
        if isinstance(outcome, NoMatch):
            return outcome
        view.claimed.add(outcome.claim)  # before any await: the next call must not pick it
        try:
            await self._record(outcome, device_ids)
        except Exception as error:
            view.claimed.discard(outcome.claim)
            log.error("node %s: could not record the assignment: %s", view.name, error)
            return NoMatch(f"could not record the assignment in the allocation log: {error}")
        envs = container_environment(
            outcome.share, outcome.card, outcome.allocation.memory_mib, view.memory_unit
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
            card_uuids=(match.card.uuid,),
            device_ids=tuple(device_ids),
        )
        seq = await self.log.append(event)
        log.info(
            "node %s: %s container %r gets %s (%d IDs), seq %d",
            self.view.name,
            match.allocation.pod.key,
            match.share.container,
            match.card.uuid,
            len(device_ids),
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


def _as_optional(outcome: Match | NoMatch) -> Match | None:
    return outcome if isinstance(outcome, Match) else None


def _summary(ids: tuple[str, ...]) -> str:
    if len(ids) <= 4:
        return ", ".join(ids) or "nothing"
    return f"{ids[0]} … {ids[-1]} ({len(ids)} IDs)"
