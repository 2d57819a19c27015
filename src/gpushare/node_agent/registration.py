"""Serving the plugin on its unix socket and staying registered with the kubelet.

The kubelet's contract: a plugin serves gRPC on a socket in the device-plugins
directory *before* it calls ``Register`` on ``kubelet.sock``; during that call the
kubelet dials back and asks ``GetDevicePluginOptions``. A restarting kubelet deletes
every socket in the directory and creates a new ``kubelet.sock``; the plugin must notice
and do both steps again. :class:`PluginEndpoint` polls for exactly that: its own socket
gone, or ``kubelet.sock`` replaced (another inode) since the last registration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import grpc

from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node_agent import metrics
from gpushare.node_agent.doorbell import pause
from gpushare.node_agent.settings import API_VERSION, NodeTarget

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_SECONDS = 30.0
"""Longer than the kubelet's own 10 s dial back, so the kubelet always answers first: a
Register we gave up on may still have been taken, and registering again then is what
the kubelet cannot survive (the first registration's stream, ending, disconnects the
second: the resource stays unregistered)."""

STOP_GRACE_SECONDS = 1.0

SERVER_OPTIONS = [("grpc.max_receive_message_length", 16 * 1024 * 1024)]
"""GetPreferredAllocation lists every free ID; never refuse one the kubelet could send."""


def socket_address(path: Path) -> str:
    return f"unix://{path.absolute()}"


def file_identity(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of a file, or ``None`` when it does not exist."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


class PluginEndpoint:
    """Serves a device plugin servicer for one resource of one node and keeps it registered."""

    def __init__(
        self,
        target: NodeTarget,
        servicer: api_pb2_grpc.DevicePluginServicer,
        resource_name: str,
        *,
        poll_seconds: float = 1.0,
        retry_seconds: float = 1.0,
        socket: Path | None = None,
    ) -> None:
        self.target = target
        self.servicer = servicer
        self.resource_name = resource_name
        self.socket = socket or target.plugin_socket
        """Our unix socket, inside the kubelet's device-plugins directory."""
        self.poll_seconds = poll_seconds
        self.retry_seconds = retry_seconds
        self.registrations = 0
        self.registered_with: tuple[int, int] | None = None
        """The identity of the ``kubelet.sock`` we are registered with."""
        self._server: grpc.aio.Server | None = None
        self._serving: tuple[int, int] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and register until ``stop`` is set; survives kubelet restarts."""
        try:
            while not stop.is_set():
                try:
                    await self._step()
                except Exception:  # e.g. the directory is unwritable: log, retry, live on
                    log.exception(
                        "node %s: device plugin endpoint of %s failed",
                        self.target.name,
                        self.resource_name,
                    )
                    self.registered_with = None
                await pause(stop, self.poll_seconds if self.registered_with else self.retry_seconds)
        finally:
            await self.close()

    async def _step(self) -> None:
        if self._server is None or self._kubelet_restarted():
            await self._restart_server()
        if self.registered_with is None:
            await self._register()

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(STOP_GRACE_SECONDS)
            self._server = None
        self._remove_socket()

    def _kubelet_restarted(self) -> bool:
        """Our socket was deleted or replaced, or kubelet.sock is another file now."""
        own = file_identity(self.socket)
        if own is None or own != self._serving:
            log.info("node %s: %s is gone; the kubelet restarted", self.target.name, self.socket)
            return True
        kubelet = file_identity(self.target.kubelet_socket)
        if self.registered_with is not None and kubelet != self.registered_with:
            log.info("node %s: kubelet.sock was replaced; registering again", self.target.name)
            return True
        return False

    async def _restart_server(self) -> None:
        if self._server is not None:
            await self._server.stop(STOP_GRACE_SECONDS)
            self._server = None
        self.registered_with = None
        self._remove_socket()
        self.target.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server(options=SERVER_OPTIONS)
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(socket_address(self.socket))
        await server.start()
        self._server = server
        self._serving = file_identity(self.socket)
        log.info("node %s: serving %s on %s", self.target.name, self.resource_name, self.socket)

    async def _register(self) -> None:
        kubelet = file_identity(self.target.kubelet_socket)
        if kubelet is None:
            log.info("node %s: waiting for %s", self.target.name, self.target.kubelet_socket)
            return
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket.name,
            resource_name=self.resource_name,
            options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        asked_before = self.options_asked()
        try:
            async with grpc.aio.insecure_channel(
                socket_address(self.target.kubelet_socket)
            ) as channel:
                stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                await stub.Register(request, timeout=REGISTER_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as error:
            taken = self.options_asked() > asked_before
            log.warning(
                "node %s: Register with the kubelet failed: %s: %s%s",
                self.target.name,
                error.code().name,
                error.details(),
                "; it dialled us back, so it took it" if taken else "",
            )
            if not taken:
                return
        self.registered_with = kubelet
        self.registrations += 1
        metrics.REGISTRATIONS.labels(node=self.target.name).inc()
        log.info("node %s: registered %s with the kubelet", self.target.name, self.resource_name)

    @property
    def registered_now(self) -> bool:
        """Registered with the kubelet that runs now: our socket is still there and
        ``kubelet.sock`` is the one we registered with (a restarted kubelet replaces it
        and deletes our socket before this endpoint's next poll notices)."""
        return (
            self.registered_with is not None
            and self._serving is not None
            and file_identity(self.socket) == self._serving
            and file_identity(self.target.kubelet_socket) == self.registered_with
        )

    def options_asked(self) -> int:
        """How often the kubelet asked our options: it dials back inside Register."""
        return int(getattr(self.servicer, "options_asked", 0))

    def _remove_socket(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        self._serving = None
