"""A test kubelet: the device-manager half of the real one, for tests and ``gpushare up``.

It does what the kubelet does with device plugins, in the same order and with the same
messages, so a plugin that works here behaves the same on a node:

* at start it deletes every unix socket in the device-plugins directory (what tells
  plugins that the kubelet restarted) and serves ``v1beta1.Registration`` on
  ``kubelet.sock``; on ``Register`` it dials the plugin back, asks its options and
  keeps a ``ListAndWatch`` stream open, holding the latest device list per resource;
* :meth:`EmbeddedKubelet.admit` allocates devices to a pod's containers (init
  containers first, then the others, in order): free IDs = healthy − held by live pods,
  IDs reused from init containers first, ``GetPreferredAllocation`` when the plugin
  offers it, then arbitrary IDs (the real kubelet iterates a Go map), one ``Allocate``
  per container and resource; a failure is an admission error worded like the kubelet's;
* it serves the pod-resources API v1 (``List``, ``GetAllocatableResources``, ``Get``)
  from what it admitted (unless told not to, as where the socket is not mounted), and,
  when asked to keep one, writes its device checkpoint
  (``<plugin dir>/kubelet_internal_checkpoint``, the kubelet's JSON layout) after every
  change (off by default: with every node's IDs in it, it costs milliseconds a pod);
* :meth:`EmbeddedKubelet.restore` makes it hold a pod's devices without calling any
  plugin: a pod it admitted before a restart, or through a device plugin this test
  kubelet does not run (``nvidia.com/gpu`` IDs that are card UUIDs, say);
* :class:`PodWatcher` (separate, so tests can drive ``admit`` without a Kubernetes API)
  watches the node's pods, admits newly bound ones and marks them Running or Failed.

Like the kubelet's device manager, it reads its checkpoint back when it starts: the
device IDs and environment of every container it admitted before a restart are held
again as soon as the pod watch names their pod (a checkpoint names pods by UID only),
and the pods keep running without any plugin being called.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import signal
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import msgspec

from gpushare.core.pods import TERMINAL_PHASES, Container, Pod, pod_from_dict
from gpushare.core.quantity import parse_count
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpushare.kubelet_api.podresources.v1 import api_pb2 as pr
from gpushare.kubelet_api.podresources.v1 import api_pb2_grpc as pr_grpc
from gpushare.logs import setup_logging
from gpushare.stalls import dump_stacks_on_stall
from gpushare.tasks import cancel_and_wait, log_if_it_fails
from gpushare.telemetry.propagation import inject_metadata

log = logging.getLogger(__name__)

VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
CONTAINERS = "containers.json"
"""What each live container was started with (env and device IDs), in the plugin
directory: the test kubelet's stand-in for asking the container runtime."""
NO_NUMA_NODE = "-1"
"""The NUMA key of a device without topology in the checkpoint's ``DeviceIDs``."""
DIAL_TIMEOUT_SECONDS = 10.0
"""The kubelet's blocking dial back to a registering plugin."""
ADMISSION_REASON = "UnexpectedAdmissionError"


class AdmissionError(Exception):
    """The pod cannot start here; ``message`` is what the kubelet writes into its status."""

    reason = ADMISSION_REASON

    def __init__(self, cause: str) -> None:
        self.message = f"Allocate failed due to {cause}, which is unexpected"
        super().__init__(self.message)


def go_status(error: grpc.aio.AioRpcError) -> str:
    """An RPC error as grpc-go prints it: ``rpc error: code = FailedPrecondition desc = …``."""
    code = "".join(part.capitalize() for part in error.code().name.split("_"))
    return f"rpc error: code = {code} desc = {error.details()}"


def socket_address(path: Path) -> str:
    return f"unix://{path.absolute()}"


@dataclass
class ContainerDevices:
    """What one container got from one resource's plugin."""

    container: str
    resource: str
    device_ids: tuple[str, ...]
    envs: dict[str, str]
    init: bool = False


@dataclass
class AdmittedPod:
    namespace: str
    name: str
    uid: str
    devices: list[ContainerDevices] = field(default_factory=list)
    containers: tuple[str, ...] = ()

    def envs(self, container: str) -> dict[str, str]:
        """Every env var the plugins gave ``container``."""
        merged: dict[str, str] = {}
        for entry in self.devices:
            if entry.container == container:
                merged.update(entry.envs)
        return merged

    def ids(self, resource: str) -> set[str]:
        return {d for entry in self.devices if entry.resource == resource for d in entry.device_ids}


class PluginEndpoint:
    """A registered plugin: its channel, options, and the device list it last sent."""

    def __init__(
        self,
        node: str,
        resource: str,
        socket: Path,
        on_change: Callable[[], None],
        list_lag_seconds: float = 0.0,
    ) -> None:
        self.node = node
        self.resource = resource
        self.socket = socket
        self.channel = grpc.aio.insecure_channel(socket_address(socket))
        self.stub = dp_grpc.DevicePluginStub(self.channel)  # type: ignore[no-untyped-call]
        self.options = dp.DevicePluginOptions()
        self.devices: dict[str, str] = {}
        """Device ID → ``Healthy``/``Unhealthy``, from the latest ListAndWatch message."""
        self._sorted_ids: list[str] | None = None
        self.counts = (0, 0)
        """(devices, healthy ones) of :attr:`devices`, counted once per list: the node
        status reporter reads it on every change, and a list holds a device per MiB."""
        self.connected = False
        self.list_lag_seconds = list_lag_seconds
        """How long taking each device list takes (a busy kubelet: seconds)."""
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        """Dial back and ask the options (inside Register, as the kubelet); raises on failure."""
        self.options = await self.stub.GetDevicePluginOptions(
            dp.Empty(), timeout=DIAL_TIMEOUT_SECONDS, wait_for_ready=True
        )
        self.connected = True

    def start_watch(self) -> None:
        self._task = asyncio.create_task(self._watch(), name=f"list-and-watch {self.resource}")

    async def _watch(self) -> None:
        try:
            async for response in self.stub.ListAndWatch(dp.Empty()):
                if self.list_lag_seconds > 0:
                    await asyncio.sleep(self.list_lag_seconds)
                self._take({device.ID: device.health for device in response.devices})
                log.info(
                    "kubelet %s: %s: %d devices (%d healthy)",
                    self.node,
                    self.resource,
                    *self._counts(),
                )
                self._on_change()
        except grpc.aio.AioRpcError as error:
            log.info(
                "kubelet %s: %s ListAndWatch ended: %s",
                self.node,
                self.resource,
                error.code().name,
            )
        finally:
            # the kubelet keeps the IDs but marks them all unhealthy until the plugin returns
            self.connected = False
            self._take(dict.fromkeys(self.devices, UNHEALTHY))
            self._on_change()

    def _take(self, devices: dict[str, str]) -> None:
        self.devices = devices
        self.counts = (len(devices), sum(1 for h in devices.values() if h == HEALTHY))
        self._sorted_ids = None

    def sorted_ids(self) -> list[str]:
        """Every device ID the plugin listed, sorted (kept until the next list: the
        checkpoint written at each admission holds them, 32,768 a card of MiB IDs)."""
        if self._sorted_ids is None:
            self._sorted_ids = sorted(self.devices)
        return self._sorted_ids

    def _counts(self) -> tuple[int, int]:
        return self.counts

    def healthy(self) -> set[str]:
        return {device for device, health in self.devices.items() if health == HEALTHY}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.channel.close()


def _is_extended_resource(name: str) -> bool:
    domain, sep, rest = name.partition("/")
    return bool(sep and domain and rest) and not domain.endswith("kubernetes.io")


def _containers_in_order(pod: Pod) -> list[tuple[Container, bool]]:
    """Init containers first, then the app containers: the kubelet's admission order;
    ``True`` for an init container that runs to completion. A native sidecar
    (``restartPolicy: Always``) is admitted in its place but kept like an app container:
    the device manager never hands its IDs on, and pod-resources lists it
    (``devicemanager/manager.go`` ``Allocate``, ``podresources/server_v1.go`` ``List``)."""
    init = [(container, not container.sidecar) for container in pod.spec.init_containers or ()]
    return [*init, *((container, False) for container in pod.spec.containers)]


def _long_running(pod: Pod) -> tuple[str, ...]:
    """The containers that run for the pod's life, as pod-resources lists them: native
    sidecars in their place among the init containers, then the app containers."""
    sidecars = [c.name for c in pod.spec.init_containers or () if c.sidecar]
    return (*sidecars, *(c.name for c in pod.spec.containers))


class EmbeddedKubelet:
    """The device manager and pod-resources server of one node's kubelet."""

    def __init__(
        self,
        node: str,
        plugin_dir: Path,
        pod_resources_socket: Path | None = None,
        seed: int | None = 0,
        *,
        serve_pod_resources: bool = True,
        keep_checkpoint: bool = False,
    ) -> None:
        self.node = node
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = (
            pod_resources_socket or plugin_dir.parent / "pod-resources" / KUBELET_SOCKET
        )
        self.serve_pod_resources = serve_pod_resources
        self.keep_checkpoint = keep_checkpoint
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.known_resources: set[str] = set()
        """Every resource a plugin ever registered (its pods need that plugin back)."""
        self.pods: dict[str, AdmittedPod] = {}
        """Admitted, live pods by UID."""
        self.checkpointed: dict[str, list[ContainerDevices]] = {}
        """What the checkpoint said each pod held when this kubelet started, by UID, until
        the pod watch names the pod (then :meth:`restore` holds it again)."""
        self.registrations = 0
        self.list_lag_seconds = 0.0
        """How long each new plugin endpoint takes to take a device list it was sent."""
        self._admitting: AdmittedPod | None = None
        self._random = random.Random(seed)
        self._admission = asyncio.Lock()
        self._changed = asyncio.Event()
        self._servers: list[grpc.aio.Server] = []

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    async def start(self) -> EmbeddedKubelet:
        """Clean the plugin directory (plugins see their sockets go) and start serving."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        if self.keep_checkpoint:
            self.checkpointed = read_checkpoint_entries(self.checkpoint_path)
        self._remove_sockets()
        registration = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(RegistrationService(self), registration)  # type: ignore[no-untyped-call]
        registration.add_insecure_port(socket_address(self.kubelet_socket))
        servers = [registration]
        if self.serve_pod_resources:
            pod_resources = grpc.aio.server()
            pr_grpc.add_PodResourcesListerServicer_to_server(
                PodResourcesService(self), pod_resources
            )  # type: ignore[no-untyped-call]
            pod_resources.add_insecure_port(socket_address(self.pod_resources_socket))
            servers.append(pod_resources)
        for server in servers:
            await server.start()
            self._servers.append(server)
        self.write_checkpoint()
        log.info("kubelet %s: serving %s", self.node, self.kubelet_socket)
        return self

    async def stop(self) -> None:
        # A plugin may register (one per resource, concurrently) while this runs: close
        # endpoints one at a time, and again after the servers stopped taking Register.
        await self._close_endpoints()
        for server in self._servers:
            await server.stop(0)
        self._servers.clear()
        await self._close_endpoints()

    async def _close_endpoints(self) -> None:
        while self.endpoints:
            _, endpoint = self.endpoints.popitem()
            await endpoint.close()

    def _remove_sockets(self) -> None:
        """What kubelet's CleanupPluginDirectory does: every unix socket goes, files stay."""
        for path in self.plugin_dir.iterdir():
            if path.is_socket():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def notify(self) -> None:
        """Wake everything waiting in :meth:`wait_until` (devices, pods or watch changed)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_until(self, predicate: Callable[[], bool], limit_seconds: float = 10.0) -> None:
        """Until ``predicate()`` holds, checked after each change; ``TimeoutError`` otherwise."""
        async with asyncio.timeout(limit_seconds):
            while not predicate():
                await self._changed.wait()

    def device_counts(self, resource: str) -> tuple[int, int]:
        """(devices, healthy ones) of ``resource``'s latest list; (0, 0) if never registered."""
        endpoint = self.endpoints.get(resource)
        return endpoint.counts if endpoint else (0, 0)

    def devices(self, resource: str) -> dict[str, str]:
        """The latest device list of ``resource`` (ID → health); empty if never registered."""
        endpoint = self.endpoints.get(resource)
        return dict(endpoint.devices) if endpoint else {}

    async def wait_for_devices(
        self,
        resource: str,
        ready: Callable[[dict[str, str]], bool] = bool,
        limit_seconds: float = 10.0,
    ) -> dict[str, str]:
        """Until ``ready(devices(resource))``; raises ``TimeoutError`` after ``limit_seconds``."""
        await self.wait_until(lambda: ready(self.devices(resource)), limit_seconds)
        return self.devices(resource)

    async def register(self, request: dp.RegisterRequest) -> None:
        """Handle a plugin's Register; raises ``ValueError`` with the kubelet's words."""
        if request.version != VERSION:
            raise ValueError(
                f'requested API version "{request.version}" is not supported by kubelet. '
                f'Supported versions are ["{VERSION}"]'
            )
        if not _is_extended_resource(request.resource_name):
            raise ValueError(f'the ResourceName "{request.resource_name}" is invalid')
        endpoint = PluginEndpoint(
            self.node,
            request.resource_name,
            self.plugin_dir / request.endpoint,
            self.notify,
            self.list_lag_seconds,
        )
        try:
            await endpoint.connect()
        except grpc.aio.AioRpcError as error:
            await endpoint.close()
            raise ValueError(f"failed to dial device plugin: {go_status(error)}") from None
        previous = self.endpoints.pop(request.resource_name, None)
        if previous is not None:
            await previous.close()
        self.endpoints[request.resource_name] = endpoint
        self.known_resources.add(request.resource_name)
        self.registrations += 1
        endpoint.start_watch()
        log.info("kubelet %s: registered %s at %s", self.node, endpoint.resource, endpoint.socket)
        self.notify()

    async def admit(self, pod: Pod) -> AdmittedPod:
        """Allocate devices to every container of ``pod``; raises :class:`AdmissionError`.

        Pods are admitted one at a time, as the kubelet does. A pod admitted before is
        returned as it was.
        """
        async with self._admission:
            uid = pod.metadata.uid
            if uid in self.pods:
                return self.pods[uid]
            admitted = AdmittedPod(
                namespace=pod.metadata.namespace,
                name=pod.metadata.name,
                uid=uid,
                containers=_long_running(pod),
            )
            self._admitting = admitted
            try:
                await self._allocate_pod(pod, admitted)
            finally:
                self._admitting = None
            self.pods[uid] = admitted
            self.write_checkpoint()
            self.write_containers()
            self.notify()
            log.info("kubelet %s: admitted %s/%s", self.node, admitted.namespace, admitted.name)
            return admitted

    def restore(self, pod: AdmittedPod) -> None:
        """Hold ``pod``'s devices from now on, calling no plugin: a pod admitted before a
        restart (read back from the checkpoint), or through a device plugin this test
        kubelet does not run. Its IDs count as taken and pod-resources lists them."""
        self.pods[pod.uid] = pod
        self.write_checkpoint()
        self.write_containers()
        self.notify()
        log.info("kubelet %s: holds %s/%s", self.node, pod.namespace, pod.name)

    async def _allocate_pod(self, pod: Pod, admitted: AdmittedPod) -> None:
        """Per container and resource, in admission order; init containers' IDs are reused."""
        reusable: dict[str, set[str]] = {}
        for container, init in _containers_in_order(pod):
            for resource, needed in self._device_requests(container):
                entry = await self._allocate(admitted, container.name, resource, needed, reusable)
                entry.init = init
                admitted.devices.append(entry)
                ids = set(entry.device_ids)
                if init:
                    reusable.setdefault(resource, set()).update(ids)
                else:
                    reusable.get(resource, set()).difference_update(ids)

    def release(self, uid: str) -> bool:
        """Forget a pod (deleted or finished): its device IDs are free again."""
        released = self.pods.pop(uid, None)
        if released is not None:
            self.write_checkpoint()
            self.write_containers()
            self.notify()
            log.info("kubelet %s: released %s/%s", self.node, released.namespace, released.name)
        return released is not None

    def _device_requests(self, container: Container) -> list[tuple[str, int]]:
        limits = (container.resources.limits if container.resources else None) or {}
        requests: list[tuple[str, int]] = []
        in_order = sorted(limits.items())
        self._random.shuffle(in_order)  # the kubelet ranges over a Go map: no set order
        for resource, quantity in in_order:
            if resource not in self.known_resources:
                continue  # not a device plugin resource: not the device manager's business
            try:
                needed = parse_count(quantity)
            except ValueError as error:
                raise AdmissionError(f"container {container.name}: {error}") from None
            if needed > 0:
                requests.append((resource, needed))
        return requests

    def live_pods(self) -> list[AdmittedPod]:
        """Admitted pods, and the one being admitted (the kubelet lists it already)."""
        admitting = [self._admitting] if self._admitting is not None else []
        return [*self.pods.values(), *admitting]

    def _held(self, resource: str, admitting: AdmittedPod) -> set[str]:
        held = admitting.ids(resource)
        for pod in self.pods.values():
            held |= pod.ids(resource)
        return held

    async def _allocate(
        self,
        admitted: AdmittedPod,
        container: str,
        resource: str,
        needed: int,
        reusable: dict[str, set[str]],
    ) -> ContainerDevices:
        endpoint = self.endpoints.get(resource)
        if endpoint is None or not endpoint.connected:
            raise AdmissionError(f"cannot allocate unregistered device {resource}")
        if not endpoint.healthy():
            raise AdmissionError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        held = self._held(resource, admitted)
        ids = await self._choose(endpoint, held, reusable.get(resource, set()), needed)
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
        )
        try:
            # The caller's trace context, if it has one (a real kubelet sends none).
            response = await endpoint.stub.Allocate(request, metadata=inject_metadata())
        except grpc.aio.AioRpcError as error:
            raise AdmissionError(go_status(error)) from None
        if not response.container_responses:
            raise AdmissionError(f"no containers return in allocation response {response}")
        envs = dict(response.container_responses[0].envs)
        return ContainerDevices(
            container=container, resource=resource, device_ids=tuple(ids), envs=envs
        )

    def _take(self, chosen: list[str], candidates: set[str], needed: int) -> bool:
        """Add ``candidates`` in arbitrary order (as a Go map iterates) until ``needed``."""
        pool = sorted(candidates.difference(chosen))
        self._random.shuffle(pool)
        chosen.extend(pool[: needed - len(chosen)])
        return len(chosen) == needed

    async def _choose(
        self, endpoint: PluginEndpoint, held: set[str], reusable: set[str], needed: int
    ) -> list[str]:
        """The device manager's devicesToAllocate, without NUMA alignment."""
        chosen: list[str] = []
        if self._take(chosen, reusable, needed):
            return chosen
        available = endpoint.healthy() - held
        remaining = needed - len(chosen)
        if len(available) < remaining:
            raise AdmissionError(
                f"requested number of devices unavailable for {endpoint.resource}. "
                f"Requested: {remaining}, Available: {len(available)}"
            )
        if endpoint.options.get_preferred_allocation_available:
            preferred = await self._preferred(endpoint, available | set(chosen), chosen, needed)
            if self._take(chosen, preferred & available, needed):
                return chosen
        if self._take(chosen, available, needed):
            return chosen
        raise AdmissionError(
            "unexpectedly allocated less resources than required. "
            f"Requested: {needed}, Got: {len(chosen)}"
        )

    async def _preferred(
        self, endpoint: PluginEndpoint, available: set[str], must: list[str], size: int
    ) -> set[str]:
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=sorted(available),
                    must_include_deviceIDs=must,
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await endpoint.stub.GetPreferredAllocation(request)
        except grpc.aio.AioRpcError as error:
            raise AdmissionError(
                f"device plugin GetPreferredAllocation rpc failed with err: {go_status(error)}"
            ) from None
        if not response.container_responses:
            return set()
        return set(response.container_responses[0].deviceIDs)

    def pod_resources(self, pod: AdmittedPod) -> pr.PodResources:
        """A pod as pod-resources lists it: sidecars and app containers (never a
        run-to-completion init container), with their device IDs."""
        containers = []
        for name in pod.containers:
            devices = [
                pr.ContainerDevices(resource_name=entry.resource, device_ids=entry.device_ids)
                for entry in pod.devices
                if entry.container == name
            ]
            containers.append(pr.ContainerResources(name=name, devices=devices))
        return pr.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / CHECKPOINT

    def checkpoint(self) -> bytes:
        """The device manager's checkpoint, in the kubelet's JSON layout (the checksum is
        a CRC of the data, not the kubelet's hash: nobody may rely on it). Encoded with
        msgspec: the standard library's encoder took half the test kubelet's time in
        bench-kube, at every admission and release."""
        entries = [
            {
                "PodUID": pod.uid,
                "ContainerName": entry.container,
                "ResourceName": entry.resource,
                "DeviceIDs": {NO_NUMA_NODE: list(entry.device_ids)},
                "AllocResp": base64.b64encode(
                    dp.ContainerAllocateResponse(envs=entry.envs).SerializeToString()
                ).decode(),
            }
            for pod in self.pods.values()
            for entry in pod.devices
        ]
        registered = {
            resource: endpoint.sorted_ids() for resource, endpoint in self.endpoints.items()
        }
        data = msgspec.json.encode(
            {"PodDeviceEntries": entries, "RegisteredDevices": registered}, order="sorted"
        )
        return b'{"Data":%b,"Checksum":%d}' % (data, zlib.crc32(data))

    def restore_checkpointed(self, pod: Pod) -> AdmittedPod | None:
        """Hold again what the checkpoint says ``pod`` held before a restart, if anything."""
        devices = self.checkpointed.pop(pod.metadata.uid, None)
        if devices is None or pod.metadata.uid in self.pods:
            return None
        restored = AdmittedPod(
            namespace=pod.metadata.namespace,
            name=pod.metadata.name,
            uid=pod.metadata.uid,
            devices=devices,
            containers=_long_running(pod),
        )
        self.restore(restored)
        return restored

    def write_checkpoint(self) -> None:
        """Replace the checkpoint file atomically, as the kubelet's checkpoint manager does
        (when keeping one)."""
        if not self.keep_checkpoint:
            return
        temporary = self.checkpoint_path.with_name(f".{CHECKPOINT}.tmp")
        temporary.write_bytes(self.checkpoint())
        os.replace(temporary, self.checkpoint_path)

    def containers(self) -> dict[str, Any]:
        """Pod UID → its namespace, name and, per app container, the env every plugin
        gave it and its device IDs per resource: what the runtime started it with."""
        return {
            pod.uid: {
                "namespace": pod.namespace,
                "name": pod.name,
                "containers": {
                    name: {
                        "env": pod.envs(name),
                        "devices": {
                            entry.resource: list(entry.device_ids)
                            for entry in pod.devices
                            if entry.container == name
                        },
                    }
                    for name in pod.containers
                },
            }
            for pod in self.pods.values()
        }

    def write_containers(self) -> None:
        """Replace :data:`CONTAINERS` atomically."""
        path = self.plugin_dir / CONTAINERS
        temporary = path.with_name(f".{CONTAINERS}.tmp")
        temporary.write_bytes(msgspec.json.encode(self.containers()))
        os.replace(temporary, path)

    def allocatable(self) -> list[pr.ContainerDevices]:
        return [
            pr.ContainerDevices(resource_name=resource, device_ids=sorted(endpoint.healthy()))
            for resource, endpoint in sorted(self.endpoints.items())
        ]


class RegistrationService(dp_grpc.RegistrationServicer):
    """``v1beta1.Registration`` on kubelet.sock."""

    def __init__(self, kubelet: EmbeddedKubelet) -> None:
        self.kubelet = kubelet

    async def Register(
        self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> dp.Empty:
        try:
            await self.kubelet.register(request)
        except ValueError as error:
            log.warning("kubelet %s: refused a registration: %s", self.kubelet.node, error)
            await context.abort(grpc.StatusCode.UNKNOWN, str(error))
        return dp.Empty()


class PodResourcesService(pr_grpc.PodResourcesListerServicer):
    """``v1.PodResourcesLister`` from the pods the kubelet admitted."""

    def __init__(self, kubelet: EmbeddedKubelet) -> None:
        self.kubelet = kubelet

    async def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        pods = [self.kubelet.pod_resources(pod) for pod in self.kubelet.live_pods()]
        return pr.ListPodResourcesResponse(pod_resources=pods)

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(devices=self.kubelet.allocatable())

    async def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        for pod in self.kubelet.live_pods():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=self.kubelet.pod_resources(pod))
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable")  # abort raises


def read_checkpoint_entries(path: Path) -> dict[str, list[ContainerDevices]]:
    """Pod UID → what each of its containers held, from a device checkpoint in the
    kubelet's layout (nothing when there is none or it cannot be read)."""
    try:
        data = json.loads(path.read_text())["Data"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        if path.exists():
            log.warning("device checkpoint %s unreadable, starting empty: %s", path, error)
        return {}
    found: dict[str, list[ContainerDevices]] = {}
    for entry in data.get("PodDeviceEntries") or ():
        try:
            response = dp.ContainerAllocateResponse.FromString(
                base64.b64decode(entry.get("AllocResp") or "")
            )
            ids = tuple(d for group in entry["DeviceIDs"].values() for d in group)
            devices = ContainerDevices(
                container=str(entry["ContainerName"]),
                resource=str(entry["ResourceName"]),
                device_ids=ids,
                envs=dict(response.envs),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            log.warning("skipping a device checkpoint entry: %s", error)
            continue
        found.setdefault(str(entry["PodUID"]), []).append(devices)
    return found


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_status(uid: str) -> dict[str, Any]:
    now = _now()
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("Initialized", "ContainersReady", "Ready")
    ]
    status = {"phase": "Running", "startTime": now, "conditions": conditions}
    return {"metadata": {"uid": uid}, "status": status}


def failed_status(uid: str, error: AdmissionError) -> dict[str, Any]:
    status = {"phase": "Failed", "reason": error.reason, "message": error.message}
    return {"metadata": {"uid": uid}, "status": status}


WatchEvent = tuple[str, dict[str, Any]]
"""``(type, raw object)`` as the watch delivers it."""
LISTED = "LISTED"
"""A watch's first event: ``{"items": [...]}``, the node's pods as listed before it."""


def _admission_order(event: WatchEvent) -> tuple[bool, str, str]:
    kind, raw = event
    meta = raw.get("metadata") or {}
    phase = (raw.get("status") or {}).get("phase")
    going = kind == "DELETED" or phase in TERMINAL_PHASES or bool(meta.get("deletionTimestamp"))
    return (not going, str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))


class PodWatcher:
    """Watches one node's pods through the Kubernetes API and drives the kubelet.

    Newly bound Pending pods are admitted, then marked Running (or Failed with the
    admission message, as the kubelet does). Each status patch names the pod's UID, as
    the kubelet's does: kube-apiserver refuses it (422) for a pod deleted and created
    again under the same name meanwhile, which would otherwise take the old pod's
    status, Failed and never scheduled. Deleted or finished pods are released,
    and a pod marked for deletion is deleted for good (the kubelet's part of graceful
    deletion). Watches filter by ``spec.nodeName`` on the server and again here.
    """

    WATCH_TIMEOUT_SECONDS = 30
    """The server ends each watch after this; the watcher lists again."""
    SILENCE_SECONDS = WATCH_TIMEOUT_SECONDS + 10
    """A watch the server has not ended this long after it began is abandoned: one that
    hangs (a connection that died without a word) must not leave the node's pods Pending."""
    RETRY_SECONDS = 1.0

    def __init__(self, kubelet: EmbeddedKubelet, api_client: Any) -> None:
        from kubernetes.aio import client

        self.kubelet = kubelet
        self.api = client.CoreV1Api(api_client)
        self.failed: set[str] = set()
        """UIDs refused at admission (never retried, as the kubelet does)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop``, whatever a watch ends with: an error, or a cancellation
        that was not ours (a library's). Either used to end the watcher without a word
        (awaiting a failed watch raised its error out of here), and the node's pods then
        stayed Pending while the kubelet went on serving its plugins."""
        log.info("kubelet %s: watching the node's pods", self.kubelet.node)
        while not stop.is_set():
            task = asyncio.create_task(self._watch())
            halt = asyncio.create_task(stop.wait())
            await asyncio.wait({task, halt}, return_when=asyncio.FIRST_COMPLETED)
            await cancel_and_wait(task, halt)  # never raises what the watch ended with
            if stop.is_set():
                return
            error = "cancelled" if task.cancelled() else task.exception()
            if error is not None:
                log.warning("kubelet %s: pod watch failed: %s", self.kubelet.node, error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.RETRY_SECONDS)

    async def _watch(self) -> None:
        """One list-and-watch; events pass a queue so a burst is admitted as a batch.

        A watch not ended ``SILENCE_SECONDS`` after it began is cancelled until it ends
        (:func:`gpushare.tasks.cancel_and_wait`): asyncio.timeout around it cancelled it
        once, a library swallowed that, and the node's pods stayed Pending with neither
        an event nor a warning (seen in CI, for two minutes)."""
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        consumer = asyncio.create_task(self._consume(queue))
        producer = asyncio.create_task(self._produce(queue))
        try:
            done, _ = await asyncio.wait({producer}, timeout=self.SILENCE_SECONDS)
            if not done:
                log.warning(
                    "kubelet %s: the pod watch did not end %d s after it began; watching again",
                    self.kubelet.node,
                    self.SILENCE_SECONDS,
                )
                await cancel_and_wait(producer)
            else:
                producer.result()  # a failed watch is the caller's to log and retry
            queue.put_nowait(None)  # the watch ended: finish what arrived, then re-list
            await consumer
        finally:
            await cancel_and_wait(producer, consumer)

    async def _produce(self, queue: asyncio.Queue[WatchEvent | None]) -> None:
        """One watch, on a connection pool of its own: a watch that hung holds only its
        own connections, never those of the next watch or of the status patches."""
        from kubernetes.aio import client, watch

        own = client.ApiClient(self.api.api_client.configuration)
        try:
            api = client.CoreV1Api(own)
            selector = f"spec.nodeName={self.kubelet.node}"
            # from the watch cache as it is, as the kubelet's informer lists; unset asks
            # for the latest revision, and when the cache cannot show it within 3 s (no
            # pod written since) kube-apiserver answers 504
            listed = await api.list_pod_for_all_namespaces(
                field_selector=selector, resource_version="0"
            )
            items = [own.sanitize_for_serialization(pod) for pod in listed.items]  # type: ignore[no-untyped-call]
            queue.put_nowait((LISTED, {"items": items}))
            async with watch.Watch() as stream:  # type: ignore[no-untyped-call]
                async for event in stream.stream(
                    api.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=listed.metadata.resource_version if listed.metadata else "0",
                    timeout_seconds=self.WATCH_TIMEOUT_SECONDS,
                ):
                    queue.put_nowait((str(event["type"]), event["raw_object"]))
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await own.close()  # type: ignore[no-untyped-call]

    async def _consume(self, queue: asyncio.Queue[WatchEvent | None]) -> None:
        while (first := await queue.get()) is not None:
            batch = [first]
            while not queue.empty():
                event = queue.get_nowait()
                if event is None:
                    await self.handle_batch(batch)
                    return
                batch.append(event)
            await self.handle_batch(batch)

    async def handle_batch(self, events: Sequence[WatchEvent]) -> None:
        """The latest event per pod; releases first, then new pods oldest first.

        The kubelet sorts a batch of new pods by creation time before admitting them,
        which is the order the device plugin's matching relies on. A watch's first batch
        starts with its list (:data:`LISTED`): every pod held here that it no longer
        shows was deleted while no watch ran, and is released (no ``DELETED`` event will
        ever say so: held for ever, it kept its devices, and the node agent reported
        them unknown to the log).
        """
        if events and events[0][0] == LISTED:
            items = events[0][1]["items"]
            self._release_unlisted(items)
            events = [*(("ADDED", item) for item in items), *events[1:]]
        log.info(
            "kubelet %s: pod watch: %s",
            self.kubelet.node,
            ", ".join(
                f"{kind} {(raw.get('metadata') or {}).get('name')}" for kind, raw in events[:8]
            )
            + (f" and {len(events) - 8} more" if len(events) > 8 else ""),
        )
        latest: dict[str, WatchEvent] = {}
        for kind, raw in events:
            meta = raw.get("metadata") or {}
            latest[str(meta.get("uid") or id(raw))] = (kind, raw)
        for kind, raw in sorted(latest.values(), key=_admission_order):
            await self.handle(kind, raw)
        self.kubelet.notify()

    def _release_unlisted(self, items: Sequence[dict[str, Any]]) -> None:
        listed = {str((item.get("metadata") or {}).get("uid")) for item in items}
        for uid, pod in list(self.kubelet.pods.items()):
            if uid not in listed:
                log.info(
                    "kubelet %s: %s/%s is gone from the API (deleted while not watched)",
                    self.kubelet.node,
                    pod.namespace,
                    pod.name,
                )
                self.kubelet.release(uid)

    async def handle(self, kind: str, raw: dict[str, Any]) -> None:
        """One watch event; never raises for a bad pod or a refused API call."""
        try:
            pod = pod_from_dict(raw)
        except Exception as error:
            log.warning("kubelet %s: unreadable pod in watch: %s", self.kubelet.node, error)
            return
        if pod.spec.node_name != self.kubelet.node:
            return
        try:
            await self._handle_pod(kind, pod)
        except Exception as error:  # the API refused or vanished: log, keep watching
            log.warning(
                "kubelet %s: %s/%s: %s",
                self.kubelet.node,
                pod.metadata.namespace,
                pod.metadata.name,
                error,
            )

    async def _handle_pod(self, kind: str, pod: Pod) -> None:
        meta = pod.metadata
        if kind == "DELETED" or pod.phase in TERMINAL_PHASES:
            self.kubelet.release(meta.uid)
            return
        if meta.deletion_timestamp is not None:
            self.kubelet.release(meta.uid)
            await self._finish_deletion(pod)
            return
        if self.kubelet.restore_checkpointed(pod) is not None:
            if pod.phase == "Pending":
                await self.api.patch_namespaced_pod_status(
                    meta.name, meta.namespace, running_status(meta.uid)
                )
            return
        if pod.phase != "Pending" or meta.uid in self.kubelet.pods or meta.uid in self.failed:
            return
        log.info("kubelet %s: admitting %s/%s", self.kubelet.node, meta.namespace, meta.name)
        try:
            await self.kubelet.admit(pod)
        except AdmissionError as error:
            self.failed.add(meta.uid)
            log.warning(
                "kubelet %s: %s/%s: %s", self.kubelet.node, meta.namespace, meta.name, error
            )
            await self.api.patch_namespaced_pod_status(
                meta.name, meta.namespace, failed_status(meta.uid, error)
            )
            return
        await self.api.patch_namespaced_pod_status(
            meta.name, meta.namespace, running_status(meta.uid)
        )

    async def _finish_deletion(self, pod: Pod) -> None:
        from kubernetes.aio.client import V1DeleteOptions, V1Preconditions
        from kubernetes.aio.client.exceptions import ApiException

        options = V1DeleteOptions(
            grace_period_seconds=0, preconditions=V1Preconditions(uid=pod.metadata.uid)
        )
        try:
            await self.api.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, body=options
            )
        except ApiException as error:
            if error.status not in (404, 409):
                raise


def parse_nodes(specs: Sequence[str]) -> list[tuple[str, Path]]:
    nodes = []
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not name or not sep or not directory:
            raise ValueError(f"--node wants NAME=PLUGIN_DIR, got {spec!r}")
        nodes.append((name, Path(directory)))
    return nodes


async def _api_client(kubeconfig: str | None) -> Any:
    """The Kubernetes client, or ``None`` without a kubeconfig.

    Made before any socket is served: importing the client blocks the event loop for
    seconds, and a plugin registering meanwhile would wait on it.
    """
    if not kubeconfig:
        log.warning("no kubeconfig: serving plugins without watching pods")
        return None
    from kubernetes.aio import config, watch  # noqa: F401 (import once, up front)

    return await config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]


async def _serve(nodes: Sequence[tuple[str, Path]], kubeconfig: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    api_client = await _api_client(kubeconfig)
    kubelets: list[EmbeddedKubelet] = []
    # A wedged test kubelet (silent, no task of it turning) says where it is stuck.
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(dump_stacks_on_stall(stop))]
    try:
        for name, directory in nodes:
            kubelet = EmbeddedKubelet(name, directory, keep_checkpoint=True)
            kubelets.append(await kubelet.start())
        if api_client is not None:
            from gpushare.embedded.kubelet_node import NodeStatusReporter

            for kubelet in kubelets:
                for part in (PodWatcher, NodeStatusReporter):
                    task = asyncio.create_task(part(kubelet, api_client).run(stop))
                    log_if_it_fails(task, f"kubelet {kubelet.node}: {part.__name__}", log)
                    tasks.append(task)
        await stop.wait()
    finally:
        stop.set()  # also when a start failed: the tasks end
        await asyncio.gather(*tasks, return_exceptions=True)
        for kubelet in kubelets:
            await kubelet.stop()
        if api_client is not None:
            await api_client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare kubelet", description=__doc__)
    parser.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="the Kubernetes API to watch"
    )
    parser.add_argument(
        "--node", action="append", default=[], metavar="NAME=DIR", help="a node (repeatable)"
    )
    args = parser.parse_args(argv)
    try:
        nodes = parse_nodes(args.node)
    except ValueError as error:
        print(f"gpushare kubelet: {error}", file=sys.stderr)
        return 2
    if not nodes:
        print("gpushare kubelet: pass at least one --node NAME=DIR", file=sys.stderr)
        return 2
    setup_logging("kubelet")
    asyncio.run(_serve(nodes, args.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
