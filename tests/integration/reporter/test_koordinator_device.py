"""``--source koordinator-device``: the reporter reads the node's Koordinator Device from the
Kubernetes API (the stand-in, serving Koordinator's CRD) and publishes it to a real
nats-server as the node's inventory, again when koordlet changes it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from nats.aio.client import Client
from nats.aio.msg import Msg

from gpushare.bus.subjects import ALL_INVENTORY
from gpushare.core.events import InventoryReported, decode_event
from gpushare.core.model import Card, CardLink
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.embedded.nats_server import NatsServer
from gpushare.kube.client import KubeClient
from gpushare.kube.koordinator_devices import read_koordinator_device
from gpushare.reporter.__main__ import parse_settings
from gpushare.reporter.running import open_backends, serve

pytestmark = pytest.mark.integration

CRD = Path(__file__).parents[2] / "fixtures/koordinator/devices.scheduling.koordinator.sh.yaml"
GROUP, VERSION, PLURAL = "scheduling.koordinator.sh", "v1alpha1", "devices"
NODE = "gpu-k"
HEARTBEAT = 0.2
UUIDS = ("GPU-0c8e6f1a-0000-4000-8000-000000000000", "GPU-0c8e6f1a-0000-4000-8000-000000000001")


def gpu(minor: int, *, health: bool = True, memory: str = "16Gi") -> dict[str, Any]:
    return {
        "type": "gpu",
        "id": UUIDS[minor],
        "minor": minor,
        "health": health,
        "resources": {
            "koordinator.sh/gpu-core": 100,
            "koordinator.sh/gpu-memory": memory,
            "koordinator.sh/gpu-memory-ratio": 100,
        },
        "topology": {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:3a", "busID": f"0:{minor}"},
    }


def koordinator_device(*devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Device",
        "metadata": {
            "name": NODE,
            "labels": {
                "node.koordinator.sh/gpu-model": "Tesla-V100-SXM2-16GB",
                "node.koordinator.sh/gpu-driver-version": "535.104.05",
            },
        },
        "spec": {"devices": list(devices)},
    }


@pytest.fixture
async def kube_api(tmp_path: Path) -> AsyncIterator[tuple[KubeApiServer, Path]]:
    server = await KubeApiServer().start()
    try:
        server.install_crd(yaml.safe_load(CRD.read_text()))
        yield server, server.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        await server.stop()


@pytest.fixture
async def kube(kube_api: tuple[KubeApiServer, Path]) -> AsyncIterator[KubeClient]:
    kube = KubeClient.connect(kube_api[1])
    yield kube
    await kube.aclose()


class Inventories:
    def __init__(self) -> None:
        self.events: list[InventoryReported] = []
        self._arrived = asyncio.Condition()

    async def on_message(self, message: Msg) -> None:
        event = decode_event(message.data)
        assert isinstance(event, InventoryReported)
        async with self._arrived:
            self.events.append(event)
            self._arrived.notify_all()

    async def wait_for(self, seen: Callable[[InventoryReported], bool]) -> InventoryReported:
        async with asyncio.timeout(30), self._arrived:
            await self._arrived.wait_for(lambda: any(seen(event) for event in self.events))
        return next(event for event in self.events if seen(event))


@pytest.fixture
async def inventories(nc: Client) -> AsyncIterator[Inventories]:
    watching = Inventories()
    subscription = await nc.subscribe(ALL_INVENTORY, cb=watching.on_message)
    await nc.flush()
    yield watching
    await subscription.unsubscribe()


def card(index: int, healthy: bool = True, reason: str = "") -> Card:
    return Card(
        index=index,
        uuid=UUIDS[index],
        model="Tesla-V100-SXM2-16GB",
        memory_mib=16384,
        healthy=healthy,
        health_reason=reason,
    )


async def test_the_reporter_publishes_the_koordinator_device_and_its_changes(
    nats_server: NatsServer,
    kube_api: tuple[KubeApiServer, Path],
    kube: KubeClient,
    inventories: Inventories,
) -> None:
    custom = client.CustomObjectsApi(kube.api_client)
    await asyncio.to_thread(
        custom.create_cluster_custom_object,
        GROUP,
        VERSION,
        PLURAL,
        koordinator_device(gpu(1), gpu(0)),
    )
    argv = ["--nats", nats_server.url, "--heartbeat", str(HEARTBEAT), "--node-name", NODE]
    settings = parse_settings(
        [*argv, "--source", "koordinator-device"], {"KUBECONFIG": str(kube_api[1])}
    )
    backends = open_backends(settings)
    stopping = asyncio.Event()
    serving = asyncio.create_task(serve(settings, backends, stopping))
    try:
        first = await inventories.wait_for(lambda event: event.node == NODE)
        assert (first.source, first.driver_version, first.mps) == (
            "koordinator",
            "535.104.05",
            False,
        )
        assert first.cards == (card(0), card(1))
        assert first.links == (CardLink(a=0, b=1, path="PXB"),)

        unhealthy = koordinator_device(gpu(0), gpu(1, health=False))
        unhealthy["spec"]["devices"][1]["conditions"] = [
            {
                "type": "Healthy",
                "status": "False",
                "reason": "XIDError",
                "message": "XID 79",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
        await asyncio.to_thread(
            custom.patch_cluster_custom_object, GROUP, VERSION, PLURAL, NODE, unhealthy
        )
        changed = await inventories.wait_for(lambda event: not event.cards[-1].healthy)
        assert changed.cards == (card(0), card(1, False, "Koordinator: XID 79"))
    finally:
        stopping.set()
        assert await asyncio.wait_for(serving, 30) == 0


async def test_a_node_without_a_device_reads_as_none(kube: KubeClient) -> None:
    assert await asyncio.to_thread(read_koordinator_device, kube, "no-such-node") is None
