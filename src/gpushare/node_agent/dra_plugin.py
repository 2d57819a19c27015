"""The DRA kubelet plugin of ``gpu.gpushare.io``: claims prepared from the allocation log.

kube-scheduler allocates a claim; the binder records it (``ClaimAllocated``); the kubelet,
before starting the pod's containers, calls ``NodePrepareResources`` here. The plugin
finds the claim in this node's fold (waiting a moment for the log, as ``Allocate`` does
for a bound pod), writes the CDI spec that hands each container its card and limits
(:func:`gpushare.core.cdi.cdi_spec`) and answers the CDI device IDs. It never calls the
Kubernetes API. ``NodeUnprepareResources`` removes the spec.

The plugin registers through the kubelet's plugin registry (``Registration`` on a socket
in ``plugins_registry``, type ``DRAPlugin``, service ``v1.DRAPlugin``); one gRPC server
serves both sockets, and is started again when the kubelet's restart removed them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path

import grpc

from gpushare.core.cdi import cdi_device_id, cdi_spec
from gpushare.core.dra import DRIVER, pool_name
from gpushare.core.state import ClaimAllocation
from gpushare.kubelet_api.dra.v1 import api_pb2 as dra_pb2
from gpushare.kubelet_api.dra.v1 import api_pb2_grpc as dra_grpc
from gpushare.kubelet_api.pluginregistration.v1 import api_pb2 as registration_pb2
from gpushare.kubelet_api.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from gpushare.node_agent.local_node import LocalNode
from gpushare.node_agent.settings import NodeTarget
from gpushare.telemetry.dra import claim_span
from gpushare.telemetry.pods import fail

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICE = "v1.DRAPlugin"
"""The gRPC service the plugin serves, as the kubelet names it (``<package>.<service>``)."""


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    """Where a prepared claim's CDI spec lives (one file per claim)."""
    return cdi_dir / f"{DRIVER.replace('.', '_')}-{claim_uid}.json"


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_bytes(data)
    os.replace(partial, path)


class DraPluginService(dra_grpc.DRAPluginServicer):
    """``NodePrepareResources``/``NodeUnprepareResources`` for one node."""

    def __init__(self, view: LocalNode, cdi_dir: Path, *, wait_seconds: float = 5.0) -> None:
        self.view = view
        self.cdi_dir = cdi_dir
        self.wait_seconds = wait_seconds
        self.prepared: dict[str, Path] = {}
        """Claim UID → its CDI spec, for the claims prepared by this process."""

    async def NodePrepareResources(
        self, request: dra_pb2.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_pb2.NodePrepareResourcesResponse:
        response = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].CopyFrom(await self._prepare(claim))
        return response

    async def NodeUnprepareResources(
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].CopyFrom(await self._unprepare(claim))
        return response

    async def _prepare(self, claim: dra_pb2.Claim) -> dra_pb2.NodePrepareResourceResponse:
        name = f"{claim.namespace}/{claim.name}"
        if not claim.uid:
            return dra_pb2.NodePrepareResourceResponse(error=f"claim {name!r} has no UID")
        held = await self._held(claim.uid)
        node = self.view.node
        if held is None:
            return dra_pb2.NodePrepareResourceResponse(
                error=f"claim {name} ({claim.uid}) is not allocated on node {node.name} in "
                f"the allocation log after {self.wait_seconds:g}s (is the gpushare binder "
                "running?)"
            )
        cards = {card.uuid: card for card in node.cards}
        try:
            spec = cdi_spec(claim.uid, held.shares, cards, mps=node.mps)
        except KeyError as error:
            return dra_pb2.NodePrepareResourceResponse(
                error=f"claim {name}: card {error} is no longer reported on {node.name}"
            )
        path = spec_path(self.cdi_dir, claim.uid)
        pod = held.pods[0] if held.pods else None
        with claim_span(
            "prepare",
            claim=name,
            node=node.name,
            pod=(pod.namespace, pod.name, pod.uid) if pod else None,
            cards=tuple(share.card_uuid for share in held.shares),
            memory_mib=held.memory_mib,
        ) as span:
            try:
                await asyncio.to_thread(_write_atomically, path, json.dumps(spec).encode())
            except OSError as error:
                reason = f"claim {name}: writing its CDI spec {path} failed: {error}"
                fail(span, reason)
                return dra_pb2.NodePrepareResourceResponse(error=reason)
        self.prepared[claim.uid] = path
        log.info("node %s: prepared claim %s (%s)", node.name, name, path.name)
        return dra_pb2.NodePrepareResourceResponse(
            devices=[
                dra_pb2.Device(
                    request_names=[share.request],
                    pool_name=pool_name(node.name),
                    device_name=share.device,
                    cdi_device_ids=[cdi_device_id(claim.uid, share)],
                    share_id=share.share_id or None,
                )
                for share in held.shares
            ]
        )

    async def _held(self, uid: str) -> ClaimAllocation | None:
        """The claim's allocation in this node's fold, waiting up to ``wait_seconds``."""
        return await self.view.decide(lambda: self.view.node.claims.get(uid), self.wait_seconds)

    async def _unprepare(self, claim: dra_pb2.Claim) -> dra_pb2.NodeUnprepareResourceResponse:
        if not claim.uid:
            return dra_pb2.NodeUnprepareResourceResponse(error="a claim without a UID")
        path = spec_path(self.cdi_dir, claim.uid)
        try:
            await asyncio.to_thread(path.unlink, missing_ok=True)
        except OSError as error:
            return dra_pb2.NodeUnprepareResourceResponse(error=f"removing {path} failed: {error}")
        self.prepared.pop(claim.uid, None)
        log.info("node %s: unprepared claim %s/%s", self.view.name, claim.namespace, claim.name)
        return dra_pb2.NodeUnprepareResourceResponse()


class DraRegistration(registration_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks a plugin in ``plugins_registry``."""

    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.registered = False
        self.error = ""

    async def GetInfo(
        self, request: registration_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> registration_pb2.PluginInfo:
        return registration_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=[DRA_SERVICE],
        )

    async def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> registration_pb2.RegistrationStatusResponse:
        self.registered, self.error = request.plugin_registered, request.error
        if request.plugin_registered:
            log.info("DRA plugin %s registered with the kubelet", DRIVER)
        else:
            log.warning("the kubelet refused DRA plugin %s: %s", DRIVER, request.error)
        return registration_pb2.RegistrationStatusResponse()


class DraEndpoint:
    """Serves the DRA plugin and its registration on one node's kubelet sockets."""

    def __init__(
        self,
        target: NodeTarget,
        service: DraPluginService,
        *,
        poll_seconds: float = 1.0,
    ) -> None:
        self.target = target
        self.service = service
        self.registration = DraRegistration(target.dra_socket)
        self.poll_seconds = poll_seconds
        self.starts = 0
        self._server: grpc.aio.Server | None = None

    @property
    def sockets(self) -> tuple[Path, Path]:
        return self.target.dra_socket, self.target.dra_registration_socket

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; serve again when a socket disappears."""
        try:
            while not stop.is_set():
                if self._server is None or not all(path.exists() for path in self.sockets):
                    try:
                        await self._serve()
                    except Exception:  # an unwritable directory, say: log, retry, live on
                        log.exception("node %s: serving the DRA plugin failed", self.target.name)
                        await self._close()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_seconds):
                        await stop.wait()
        finally:
            await self._close()

    async def _serve(self) -> None:
        await self._close()
        server = grpc.aio.server()
        dra_grpc.add_DRAPluginServicer_to_server(self.service, server)  # type: ignore[no-untyped-call]
        registration_grpc.add_RegistrationServicer_to_server(self.registration, server)  # type: ignore[no-untyped-call]
        for path in self.sockets:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._server = server
        self.starts += 1
        log.info("node %s: DRA plugin %s serving on %s", self.target.name, DRIVER, self.sockets[0])

    async def _close(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
            self.registration.registered = False
