"""Checking the log against the kubelet's pod-resources API, after Allocate and periodically.

Matching by the card the IDs name means Allocate never hands a container another card
than the log gave it. What this check still catches is everything the agent cannot see
from inside an Allocate call: the kubelet restoring assignments from its checkpoint
while the agent was away, containers admitted around the scheduler, and ghosts (pods
the log still holds but the kubelet no longer runs). See :mod:`.reconciling`.

What remains (by design, for now): a finding is logged at error level, counted
(``gpushare_node_agent_card_mismatches_total``, ``..._reconcile_findings``) and listed
in :meth:`PodResourcesCheck.inspect`; nothing is repaired. A container already
running on a card cannot be moved, and releasing a ghost is the binder's decision
(``PodReleased(reason="reconciled")``), not the device plugin's. A ghost is reported
only when two checks in a row see it, since the kubelet lists a container a moment
after Allocate returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from pathlib import Path
from typing import Any

import grpc

from gpushare.kubelet_api.podresources.v1 import api_pb2, api_pb2_grpc
from gpushare.node_agent import metrics
from gpushare.node_agent.reconciling import (
    FINDING_KINDS,
    Finding,
    KubeletContainer,
    compare_with_log,
)
from gpushare.node_agent.registration import socket_address
from gpushare.node_agent.view import NodeView

log = logging.getLogger(__name__)

LIST_TIMEOUT_SECONDS = 10.0


def held_devices(
    response: api_pb2.ListPodResourcesResponse, resource_names: str | Collection[str]
) -> list[KubeletContainer]:
    """The containers holding device IDs of ``resource_names``: one entry per resource."""
    names = {resource_names} if isinstance(resource_names, str) else set(resource_names)
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


async def list_pod_resources(socket: Path) -> api_pb2.ListPodResourcesResponse:
    async with grpc.aio.insecure_channel(socket_address(socket)) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        response: api_pb2.ListPodResourcesResponse = await stub.List(
            api_pb2.ListPodResourcesRequest(), timeout=LIST_TIMEOUT_SECONDS
        )
        return response


class PodResourcesCheck:
    """Compares one node's kubelet assignments with its fold, on demand and on a timer."""

    def __init__(
        self,
        view: NodeView,
        socket: Path,
        resource_names: str | Collection[str],
        interval_seconds: float = 30.0,
    ) -> None:
        self.view = view
        self.socket = socket
        self.resource_names = (
            (resource_names,) if isinstance(resource_names, str) else tuple(resource_names)
        )
        self.interval_seconds = interval_seconds
        self.findings: tuple[Finding, ...] = ()
        self.checks = 0
        self.mismatches_total = 0
        self.last_error: str | None = None
        self._suspects: set[tuple[str, str, str]] = set()
        self._counted: set[tuple[str, str, str]] = set()
        self._poked = asyncio.Event()
        self._checked = asyncio.Event()

    def poke(self) -> None:
        """Check soon (called after each successful Allocate)."""
        self._poked.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            timeout = self.interval_seconds if self.interval_seconds > 0 else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_poke_or_stop(stop), timeout)
            if stop.is_set():
                return
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
        """One comparison; never raises (an unreachable kubelet is recorded, not fatal)."""
        try:
            response = await list_pod_resources(self.socket)
        except grpc.aio.AioRpcError as error:
            self.last_error = f"{error.code().name}: {error.details()}"
            log.debug("node %s: pod-resources List failed: %s", self.view.name, self.last_error)
            return self.findings
        self.last_error = None
        held = held_devices(response, self.resource_names)
        found = compare_with_log(self.view.node, self.view.tables, held, self.view.asks)
        self._record(found)
        return self.findings

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
        }

    async def _wait_poke_or_stop(self, stop: asyncio.Event) -> None:
        poke = asyncio.ensure_future(self._poked.wait())
        halt = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({poke, halt}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            poke.cancel()
            halt.cancel()
        self._poked.clear()

    def _record(self, found: list[Finding]) -> None:
        """Keep confirmed findings; log and count each new mismatch once."""
        suspects = {f.key for f in found if f.kind == "missing_from_kubelet"}
        confirmed = [
            f for f in found if f.kind != "missing_from_kubelet" or f.key in self._suspects
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
