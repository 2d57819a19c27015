"""Checking the log against the kubelet's pod-resources API, after Allocate and periodically.

Matching by the card the IDs name means Allocate never hands a container another card
than the log gave it. What this check still catches is everything the agent cannot see
from inside an Allocate call: the kubelet restoring assignments from its checkpoint
while the agent was away, containers admitted around the scheduler, and ghosts (pods
the log still holds but the kubelet no longer runs). See :mod:`.reconciling`.

A finding is logged at error level, counted (``gpushare_node_agent_card_mismatches_total``,
``..._reconcile_findings``), listed in :meth:`PodResourcesCheck.inspect`, and recorded in
the log (:mod:`.correcting`): a container on other cards than the log says is
``AllocationCorrected`` to the kubelet's cards (a running container cannot be moved, so
the log follows it); anything else is a ``DiscrepancyFound``, since releasing a ghost or
adopting a stranger is the binder's decision, not the device plugin's. A ghost is
reported only when two checks in a row see it, since the kubelet lists a container a
moment after Allocate returns; a container unknown to the log is recorded only when two
checks in a row see it, since a deleted pod's containers outlive its release a moment.

The same check reads the devices of the resources this agent does *not* serve (another
device plugin's pods, e.g. ``nvidia.com/gpu``; from the kubelet's device checkpoint when
pod-resources cannot be reached) and appends ``ForeignCardsHeld`` whenever the cards
they hold differ from the fold's (:mod:`.foreign`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from gpushare.core.ports import AllocationLog
from gpushare.kubelet_api.podresources.v1 import api_pb2, api_pb2_grpc
from gpushare.node_agent import metrics
from gpushare.node_agent.admission import ListedPod
from gpushare.node_agent.checkpoint import read_checkpoint
from gpushare.node_agent.correcting import corrections, foreign_held, foreign_overlaps
from gpushare.node_agent.doorbell import Doorbell, pause
from gpushare.node_agent.foreign import ForeignDevices, ForeignMatch, match_foreign
from gpushare.node_agent.local_node import LocalNode
from gpushare.node_agent.reconciling import (
    FINDING_KINDS,
    Finding,
    KubeletContainer,
    compare_with_log,
)
from gpushare.node_agent.recording import Recorder
from gpushare.node_agent.registration import socket_address

log = logging.getLogger(__name__)

POKE_SETTLE_SECONDS = 0.5
"""A check asked for by an Allocate runs this long after it: pods admitted in a burst
(a Deployment scaled up, a Job's pods) cost the kubelet one pod-resources list, not one
each, and the kubelet has recorded the container the Allocate was for."""

LIST_TIMEOUT_SECONDS = 10.0
ADMISSION_LIST_TIMEOUT_SECONDS = 2.0
"""How long an Allocate or GetPreferredAllocation waits for pod-resources to say which
pod is being admitted, before falling back to the order-based guess."""


def _names(resource_names: str | Collection[str]) -> set[str]:
    return {resource_names} if isinstance(resource_names, str) else set(resource_names)


def held_devices(
    response: api_pb2.ListPodResourcesResponse, resource_names: str | Collection[str]
) -> list[KubeletContainer]:
    """The containers holding device IDs of ``resource_names``: one entry per resource."""
    names = _names(resource_names)
    held: list[KubeletContainer] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            ids: dict[str, list[str]] = {}
            for devices in container.devices:
                if devices.resource_name in names:
                    ids.setdefault(devices.resource_name, []).extend(devices.device_ids)
            held.extend(
                KubeletContainer(pod.namespace, pod.name, container.name, tuple(found), resource)
                for resource, found in ids.items()
                if found
            )
    return held


def foreign_devices(
    response: api_pb2.ListPodResourcesResponse, ours: str | Collection[str]
) -> list[ForeignDevices]:
    """Every container's device IDs of the resources *not* in ``ours``."""
    names = _names(ours)
    return [
        ForeignDevices(
            f"{pod.namespace}/{pod.name}",
            container.name,
            devices.resource_name,
            tuple(devices.device_ids),
        )
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        if devices.resource_name not in names and devices.device_ids
    ]


async def list_pod_resources(
    socket: Path, timeout_seconds: float = LIST_TIMEOUT_SECONDS
) -> api_pb2.ListPodResourcesResponse:
    async with grpc.aio.insecure_channel(socket_address(socket)) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        response: api_pb2.ListPodResourcesResponse = await stub.List(
            api_pb2.ListPodResourcesRequest(), timeout=timeout_seconds
        )
        return response


async def allocatable_counts(socket: Path, timeout_seconds: float) -> dict[str, int]:
    """Resource name → how many of its device IDs the kubelet can allocate now (the
    healthy ones of the device lists it has processed). Raises ``grpc.aio.AioRpcError``."""
    async with grpc.aio.insecure_channel(socket_address(socket)) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        response: api_pb2.AllocatableResourcesResponse = await stub.GetAllocatableResources(
            api_pb2.AllocatableResourcesRequest(), timeout=timeout_seconds
        )
    counts: dict[str, int] = {}
    for devices in response.devices:
        counts[devices.resource_name] = counts.get(devices.resource_name, 0) + len(
            devices.device_ids
        )
    return counts


def pods_listed(
    response: api_pb2.ListPodResourcesResponse, resource_names: str | Collection[str]
) -> list[ListedPod]:
    """Every listed pod with, per app container, which of ``resource_names`` it holds."""
    names = _names(resource_names)
    return [
        ListedPod(
            namespace=pod.namespace,
            name=pod.name,
            holding={
                container.name: frozenset(
                    devices.resource_name
                    for devices in container.devices
                    if devices.resource_name in names and devices.device_ids
                )
                for container in pod.containers
            },
        )
        for pod in response.pod_resources
    ]


async def listed_pods(
    socket: Path, resource_names: str | Collection[str]
) -> list[ListedPod] | None:
    """:func:`pods_listed` from the kubelet now; ``None`` when it does not answer within
    :data:`ADMISSION_LIST_TIMEOUT_SECONDS` (the kubelet is waiting on our answer)."""
    try:
        response = await list_pod_resources(socket, ADMISSION_LIST_TIMEOUT_SECONDS)
    except grpc.aio.AioRpcError as error:
        log.warning("pod-resources at %s did not answer: %s", socket, error.details())
        return None
    return pods_listed(response, resource_names)


class PodResourcesCheck:
    """Compares one node's kubelet assignments with its fold, on demand and on a timer,
    and records what it finds in the log (when given the log)."""

    def __init__(
        self,
        view: LocalNode,
        socket: Path,
        resource_names: str | Collection[str],
        interval_seconds: float = 30.0,
        *,
        allocation_log: AllocationLog | None = None,
        checkpoint: Path | None = None,
        at_start: bool = False,
        missing_grace_seconds: float = 0.0,
    ) -> None:
        self.view = view
        self.missing_grace_seconds = missing_grace_seconds
        """A container the kubelet stopped listing is a finding only after this long."""
        self._missing_since: dict[tuple[str, str, str], float] = {}
        self.socket = socket
        self.resource_names = (
            (resource_names,) if isinstance(resource_names, str) else tuple(resource_names)
        )
        self.interval_seconds = interval_seconds
        self.checkpoint = checkpoint
        """The kubelet's device checkpoint, read for foreign cards when pod-resources fails."""
        self.at_start = at_start
        self.findings: tuple[Finding, ...] = ()
        self.foreign: ForeignMatch | None = None
        self.foreign_source: str | None = None
        self.checks = 0
        self.mismatches_total = 0
        self.last_error: str | None = None
        self.recorder = Recorder(view, allocation_log) if allocation_log else None
        self.foreign_recorder = Recorder(view, allocation_log) if allocation_log else None
        self._suspects: set[tuple[str, str, str]] = set()
        self._counted: set[tuple[str, str, str]] = set()
        self._previous: set[tuple[str, str, str]] = set()
        self._lock = asyncio.Lock()
        self._poked = Doorbell()
        self.poke_settle_seconds = POKE_SETTLE_SECONDS
        """How long a check asked for by an Allocate waits for the rest of the burst."""
        self._checked = asyncio.Event()

    def poke(self) -> None:
        """Check soon (called after each successful Allocate)."""
        self._poked.ring()

    async def run(self, stop: asyncio.Event) -> None:
        if self.at_start:  # a restart re-asserts what the kubelet holds
            await self._check_safely()
        while not stop.is_set():
            poked = await self._poked.wait(stop, self.interval_seconds or None)
            if poked and self.poke_settle_seconds:
                # the other Allocates of a burst join this check instead of one each
                await pause(stop, self.poke_settle_seconds)
                self._poked.clear()
            if stop.is_set():
                return
            await self._check_safely()

    async def _check_safely(self) -> None:
        try:
            await self.check()
        except Exception:  # a bug here must not take the device plugin down
            log.exception("node %s: pod-resources check failed", self.view.name)

    async def wait_for_checks(self, count: int) -> None:
        """Until at least ``count`` checks have completed (for tests and ``inspect``)."""
        while self.checks < count:
            checked = self._checked
            await checked.wait()

    async def check(self) -> tuple[Finding, ...]:
        """One comparison; never raises for an unreachable kubelet (that is recorded).

        Without pod-resources the findings stay as they were and foreign cards come
        from the device checkpoint, if there is one."""
        async with self._lock:
            try:
                response = await list_pod_resources(self.socket)
            except grpc.aio.AioRpcError as error:
                self.last_error = f"{error.code().name}: {error.details()}"
                log.debug("node %s: pod-resources List failed: %s", self.view.name, self.last_error)
                if self.checkpoint is not None:
                    foreign = await read_checkpoint(self.checkpoint, self.resource_names)
                    if foreign is not None:
                        await self._assert_foreign(foreign, "checkpoint")
                return self.findings
            self.last_error = None
            held = held_devices(response, self.resource_names)
            found = compare_with_log(self.view.node, self.view.tables, held, self.view.asks)
            confirmed = self._record(found)
            await self._correct(confirmed)
            foreign = foreign_devices(response, self.resource_names)
            await self._assert_foreign(foreign, "pod-resources")
            return self.findings

    async def _correct(self, confirmed: Sequence[Finding]) -> None:
        """Append what the confirmed findings call for; a container unknown to the log
        only once a second check in a row sees it."""
        lasting = [f for f in confirmed if f.kind != "unknown_to_log" or f.key in self._previous]
        self._previous = {f.key for f in confirmed}
        if self.recorder is not None:
            await self.recorder.record(corrections(self.view.node, lasting, datetime.now(UTC)))

    async def _assert_foreign(self, devices: list[ForeignDevices], source: str) -> None:
        node = self.view.node
        if not node.cards:
            return  # no inventory yet: no card to name
        match = match_foreign(node.cards, devices)
        if self.foreign is None or match.unmatched != self.foreign.unmatched:
            for unmatched in match.unmatched:
                log.warning("node %s: foreign device %s names no card", self.view.name, unmatched)
        self.foreign, self.foreign_source = match, source
        metrics.FOREIGN_CARDS.labels(node=self.view.name).set(len(match.holds))
        if self.foreign_recorder is None:
            return
        now = datetime.now(UTC)
        held = foreign_held(node, match.holds, now)
        events = [held] if held is not None else []
        await self.foreign_recorder.record([*events, *foreign_overlaps(node, match.holds, now)])

    def inspect(self) -> dict[str, Any]:
        return {
            "socket": str(self.socket),
            "checks": self.checks,
            "card_mismatches_total": self.mismatches_total,
            "last_error": self.last_error,
            "findings": [
                {"kind": f.kind, "pod": f.pod, "container": f.container, "detail": f.detail}
                for f in self.findings
            ],
            "foreign": {
                "source": self.foreign_source,
                "cards": [hold.card_uuid for hold in self.foreign.holds] if self.foreign else [],
                "unmatched": list(self.foreign.unmatched) if self.foreign else [],
            },
        }

    def _record(self, found: list[Finding]) -> list[Finding]:
        """Keep confirmed findings; log and count each new mismatch once.

        A container missing from the kubelet's list is confirmed once two checks in a row
        saw it missing and ``missing_grace_seconds`` have passed since the first."""
        now = asyncio.get_running_loop().time()
        suspects = {f.key for f in found if f.kind == "missing_from_kubelet"}
        since = {key: self._missing_since.get(key, now) for key in suspects}
        self._missing_since = since
        confirmed = [
            f
            for f in found
            if f.kind != "missing_from_kubelet"
            or (f.key in self._suspects and now - since[f.key] >= self.missing_grace_seconds)
        ]
        self._suspects = suspects
        self.checks += 1
        checked, self._checked = self._checked, asyncio.Event()
        checked.set()
        for finding in confirmed:
            if finding.key in self._counted:
                continue
            self._counted.add(finding.key)
            log.error(
                "node %s: %s: %s container %r: %s",
                self.view.name,
                finding.kind,
                finding.pod,
                finding.container,
                finding.detail,
            )
            if finding.kind == "card_mismatch":
                self.mismatches_total += 1
                metrics.CARD_MISMATCHES.labels(node=self.view.name).inc()
        self._counted &= {f.key for f in confirmed}
        self.findings = tuple(confirmed)
        for kind in FINDING_KINDS:
            count = sum(1 for f in confirmed if f.kind == kind)
            metrics.RECONCILE_FINDINGS.labels(node=self.view.name, kind=kind).set(count)
        return confirmed
