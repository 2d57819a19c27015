"""The device plugin gRPC service the kubelet calls (``v1beta1.DevicePlugin``).

One instance serves one resource (one socket): ``aliyun.com/gpu-mem``,
``gpushare.io/gpu-core``, ... (:mod:`.resources`).

* ``ListAndWatch`` streams the node's whole device list, again on every change.
* Both calls first ask the kubelet's pod-resources API which pod it is admitting
  (:mod:`.admission`): the one listed pod still waiting for this resource's IDs. The call
  is that pod's first container (spec order) that asked this resource, to get its cards
  or only to count, and has not had its call on it yet (:mod:`.answers`).
* ``GetPreferredAllocation`` advises exactly ``allocation_size`` IDs, every
  ``must_include`` one among them, on the cards the log chose for that pod's waiting
  container, so the kubelet's otherwise arbitrary pick lands there.
* ``Allocate`` matches the IDs to that container (when pod-resources cannot say, to
  the first container in admission order still waiting for this resource that the IDs
  fit, keyed or counting, :mod:`.matching`), records the match as ``ContainerAssigned``
  (acknowledged by JetStream before answering) and returns the container's environment
  (:func:`gpushare.core.environment.container_environment`: every card it got, limits
  and, on an MPS node, MPS's variables). A call for a resource the container asked only
  besides its keyed one is answered with an empty response (and remembered, so the next
  call on the resource is the next container's): the kubelet merges the responses of all
  a container's resources, and the keyed one carries everything.
  With no match it fails ``FAILED_PRECONDITION`` with the reason, which the kubelet
  puts into the pod's admission error.

When the log is a moment behind the kubelet (the binder appends ``PodBound`` right
after the API accepted the binding), a call that finds nothing reads the node's
newest events and waits up to ``match_wait_seconds`` for the fold before giving up.
IDs this node never advertised are refused at once: no wait can explain them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import grpc
from tenacity import AsyncRetrying, RetryCallState, stop_after_delay, wait_fixed

from gpushare.core.device_ids import compact_ids
from gpushare.core.environment import container_environment
from gpushare.core.events import ContainerAssigned
from gpushare.core.ports import AllocationLog
from gpushare.core.requests import GPU_MEM
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node_agent import metrics
from gpushare.node_agent.admission import ListedPod
from gpushare.node_agent.answers import Knowledge, advise, allocation_for, settled_allocation
from gpushare.node_agent.device_table import DeviceTable
from gpushare.node_agent.local_node import LocalNode
from gpushare.node_agent.matching import (
    CountOnly,
    Match,
    NoMatch,
    exactly,
    fallback_ids,
    ids_per_card,
    offer_of,
)
from gpushare.node_agent.podresources import listed_pods
from gpushare.telemetry.deviceplugin import allocate_call, allocate_refused, allocate_span

log = logging.getLogger(__name__)

T = TypeVar("T")

RECORD_RETRY_SECONDS = 20.0
"""How long an Allocate keeps trying to record its assignment while NATS is away."""


def assignment_id(match: Match) -> str:
    """The same container of the same reservation is always the same event."""
    return f"assigned-{match.allocation.reservation_id}-{match.share.container}"


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource of one node; the same instance survives re-registrations."""

    def __init__(
        self,
        view: LocalNode,
        allocation_log: AllocationLog,
        match_wait_seconds: float = 5.0,
        on_assigned: Callable[[], None] | None = None,
        resource: str = GPU_MEM,
        *,
        pod_resources: Path | None = None,
        on_list_sent: Callable[[], None] | None = None,
    ) -> None:
        self.view = view
        self.log = allocation_log
        self.on_list_sent = on_list_sent
        """Called after each device list went out on ``ListAndWatch``."""
        self.match_wait_seconds = match_wait_seconds
        self.on_assigned = on_assigned
        self.resource = resource
        self.pod_resources = pod_resources
        """The kubelet's pod-resources socket: which pod it is admitting (None: guess)."""
        self.options_asked = 0
        """``GetDevicePluginOptions`` calls: the kubelet dials back inside ``Register``."""
        self.watching = 0
        """Open ``ListAndWatch`` streams that have sent the device list: the kubelet has
        this resource's devices and can allocate them."""

    @property
    def table(self) -> DeviceTable:
        return self.view.tables[self.resource]

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        self.options_asked += 1
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        version = -1
        log.info("node %s: kubelet opened ListAndWatch of %s", self.view.name, self.resource)
        sent = False
        try:
            while True:
                version = await self.view.wait_devices(version)
                yield self.view.responses[self.resource]
                if not sent:
                    sent = True
                    self.watching += 1
                if self.on_list_sent is not None:
                    self.on_list_sent()
        finally:
            if sent:
                self.watching -= 1

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

    async def _listed(self) -> list[ListedPod] | None:
        """The kubelet's active pods, or ``None`` when it cannot say."""
        if self.pod_resources is None:
            return None
        return await listed_pods(self.pod_resources, self.view.resources)

    def _known(self, listed: Sequence[ListedPod] | None) -> Knowledge:
        view = self.view
        return Knowledge(
            node=view.node,
            table=self.table,
            listed=listed,
            asks=view.asks,
            claimed=view.claimed,
            answered=view.answered,
        )

    async def _prefer(self, request: api_pb2.ContainerPreferredAllocationRequest) -> list[str]:
        available = list(request.available_deviceIDs)
        must = list(request.must_include_deviceIDs)
        offered = offer_of(available, must)
        size = int(request.allocation_size)
        view = self.view
        listed = await self._listed()
        log.debug(
            "node %s: GetPreferredAllocation size=%d must=%s available=%d IDs",
            view.name,
            size,
            must,
            len(available),
        )

        def decide() -> tuple[str, ...] | None:
            return advise(
                self._known(listed),
                available=available,
                must_include=must,
                size=size,
                offered=offered,
            )

        chosen = await self._decide(decide)
        metrics.PREFERRED.labels(view.name, "fallback" if chosen is None else "matched").inc()
        if chosen is None:
            chosen = fallback_ids(self.table, available, must, size, offered=offered)
            log.warning(
                "node %s: no waiting container of %d %s; advising %s",
                view.name,
                size,
                view.memory_unit if self.resource == GPU_MEM else self.resource,
                _summary(chosen),
            )
        return list(exactly(self.table, size, must, chosen, available, offered=offered))

    async def _allocate(self, device_ids: list[str]) -> api_pb2.ContainerAllocateResponse | NoMatch:
        view = self.view
        per_card = ids_per_card(self.table, device_ids)
        if isinstance(per_card, NoMatch):  # IDs never advertised: no wait can explain them
            return NoMatch(f"on node {view.name}: {per_card.reason}")
        listed = await self._listed()

        def decide() -> Match | CountOnly | NoMatch:
            return allocation_for(self._known(listed), device_ids)

        def decided() -> Match | CountOnly | None:
            return settled_allocation(self._known(listed), device_ids)

        found: Match | CountOnly | None = await self._decide(decided)
        outcome = found or decide()
        if isinstance(outcome, NoMatch):
            return outcome
        if isinstance(outcome, CountOnly):
            view.answered.add(outcome.call(self.resource))  # the next call is the next one's
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
        planned = {
            share.card_uuid
            for share in outcome.allocation.shares
            if share.container == outcome.share.container
        }
        if any(card.uuid not in planned for card in outcome.cards):
            log.warning(
                "node %s: the kubelet handed %s container %r %s, not the log's cards; "
                "the pod-resources check moves the log",
                view.name,
                outcome.allocation.pod.key,
                outcome.share.container,
                ", ".join(card.uuid for card in outcome.cards),
            )
        view.claimed.add(outcome.claim)  # before any await: the next call must not pick it
        view.answered.add(outcome.call(self.resource))
        try:
            await self._record(outcome, device_ids)
        except Exception as error:
            view.claimed.discard(outcome.claim)
            view.answered.discard(outcome.call(self.resource))
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
            device_ids=compact_ids(device_ids),
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
            seq = await self._append(event)
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

    async def _append(self, event: ContainerAssigned) -> int:
        """Append, retrying for up to :data:`RECORD_RETRY_SECONDS` while NATS is away (a
        restarting server): the kubelet waits on Allocate, and refusing would fail the pod
        for good. The event's id makes a retried append of an accepted one a no-op."""

        def warn(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            log.warning(
                "node %s: recording %s failed (%s); retrying", self.view.name, event.id, error
            )

        retrying = AsyncRetrying(
            stop=stop_after_delay(RECORD_RETRY_SECONDS),
            wait=wait_fixed(0.25),
            before_sleep=warn,
            reraise=True,
        )
        return await retrying(self.log.append, event)

    async def _decide(self, decide: Callable[[], T | None]) -> T | None:
        """``decide()`` now, else as the log catches up, for up to ``match_wait_seconds``
        (:meth:`LocalNode.decide`)."""
        return await self.view.decide(decide, self.match_wait_seconds)


def _summary(ids: tuple[str, ...]) -> str:
    if len(ids) <= 4:
        return ", ".join(ids) or "nothing"
    return f"{ids[0]} … {ids[-1]} ({len(ids)} IDs)"
