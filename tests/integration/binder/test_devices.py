"""The binder keeps a Device per node in the API: real nats-server, the API stand-in."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from nats.js import JetStreamContext

from gpushare.binder.service import Binder
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.core.events import InventoryReported, PodReleased
from gpushare.core.model import Card
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.tasks import cancel_and_wait
from tests.fakes import FakeClock
from tests.integration.binder.conftest import StartBinder
from tests.integration.binder.test_binder import create_pod, reserve
from tests.integration.kube.waiting import eventually

CRD = Path(__file__).parents[3] / "deploy/base/crds/devices.gpushare.io.yaml"
DEVICES = "devices.gpushare.io"
NODE = "gpu-a.example"
CARDS = (
    Card(index=0, uuid="GPU-0", model="Tesla T4", memory_mib=15360),
    Card(index=1, uuid="GPU-1", model="Tesla T4", memory_mib=15360),
)
FAST_DEVICES = {"device_sync_interval_s": 0.05}


def install_crd(kube_api: KubeApiServer) -> None:
    kube_api.install_crd(yaml.safe_load(CRD.read_text()))


async def report(js: JetStreamContext, clock: FakeClock, *cards: Card) -> InventoryReported:
    event = InventoryReported(
        id=f"inventory-{NODE}-{clock.now().timestamp()}",
        at=clock.now(),
        node=NODE,
        cards=cards or CARDS,
        source="fixture",
        heartbeat_seconds=5,
        driver_version="550.54.15",
    )
    await publish_inventory(js, event)
    return event


def device(kube_api: KubeApiServer, name: str = NODE) -> dict[str, Any] | None:
    return kube_api.get(DEVICES, name)


def card_status(kube_api: KubeApiServer, index: int) -> dict[str, Any]:
    stored = device(kube_api)
    assert stored is not None
    card: dict[str, Any] = stored["status"]["cards"][index]
    return card


def status_is(kube_api: KubeApiServer, **expected: object) -> bool:
    stored = device(kube_api)
    status = (stored or {}).get("status") or {}
    return all(status.get(key) == value for key, value in expected.items())


async def test_a_node_s_cards_appear_as_its_device(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    await report(js, clock)
    await start_binder(**FAST_DEVICES)
    await eventually(lambda: status_is(kube_api, cardCount=2))
    stored = device(kube_api)
    assert stored is not None
    assert stored["apiVersion"] == "gpushare.io/v1alpha1"
    assert stored["spec"] == {"nodeName": NODE}
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpushare-binder"}
    status = stored["status"]
    assert (status["model"], status["memoryMiB"], status["allocatedMiB"]) == ("Tesla T4", 30720, 0)
    assert (status["healthy"], status["driverVersion"]) == ("2/2", "550.54.15")
    assert [card["uuid"] for card in status["cards"]] == ["GPU-0", "GPU-1"]


async def test_reservations_and_releases_move_the_allocated_memory(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    await report(js, clock)
    await start_binder(**FAST_DEVICES)
    pod = create_pod(kube_api, "p1", {"main": 4096, "side": 1024})
    reserved = await reserve(js, clock, pod, {"main": 4096, "side": 1024})
    await eventually(lambda: status_is(kube_api, allocatedMiB=5120, podCount=1))
    await eventually(lambda: card_status(kube_api, 0)["pods"][0]["phase"] == "Bound")
    card = card_status(kube_api, 0)
    assert (card["allocatedMiB"], card["freeMiB"]) == (5120, 15360 - 5120)
    assert card["pods"] == [
        {
            "namespace": "ns",
            "name": "p1",
            "uid": pod.uid,
            "memoryMiB": 5120,
            "corePercent": 0,
            "containers": ["main", "side"],
            "phase": "Bound",
        }
    ]
    assert card_status(kube_api, 1)["pods"] == []

    released = PodReleased(
        id="release-p1",
        at=clock.now(),
        node=NODE,
        pod=pod,
        reservation_id=reserved.id,
        reason="deleted",
    )
    await AllocationLog(js).append(released)
    await eventually(lambda: status_is(kube_api, allocatedMiB=0, podCount=0))
    assert card_status(kube_api, 0)["pods"] == []


async def test_an_unhealthy_card_shows_healthy_false_with_its_reason(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    await report(js, clock)
    await start_binder(**FAST_DEVICES)
    await eventually(lambda: status_is(kube_api, healthy="2/2"))
    clock.advance(5)
    broken = Card(
        index=1,
        uuid="GPU-1",
        model="Tesla T4",
        memory_mib=15360,
        healthy=False,
        health_reason="XID 79",
    )
    await report(js, clock, CARDS[0], broken)
    await eventually(lambda: status_is(kube_api, healthy="1/2"))
    card = card_status(kube_api, 1)
    assert (card["healthy"], card["healthReason"]) == (False, "XID 79")


async def test_an_unchanged_heartbeat_writes_nothing(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    await report(js, clock)
    binder = await start_binder(**FAST_DEVICES)
    await eventually(lambda: binder.devices.written(NODE) is not None)
    writes = kube_api.requests("PUT", rf"/devices/{NODE}/status$")
    clock.advance(5)
    heartbeat = await report(js, clock)
    await eventually(lambda: binder.follower.state.node(NODE).inventory_at == heartbeat.at)
    await binder.devices.sync(NODE)
    assert kube_api.requests("PUT", rf"/devices/{NODE}/status$") == writes


async def test_a_device_edited_by_hand_is_put_back_at_resync(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    await report(js, clock)
    binder = await start_binder(**FAST_DEVICES)
    await eventually(lambda: status_is(kube_api, cardCount=2))
    kube_api.delete(DEVICES, NODE)
    await binder.devices.resync()
    assert status_is(kube_api, cardCount=2, allocatedMiB=0)


async def test_the_device_of_a_gone_node_is_deleted(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    kube_api.store.write(
        DEVICES,
        {
            "apiVersion": "gpushare.io/v1alpha1",
            "kind": "Device",
            "metadata": {
                "name": "old-node",
                "labels": {"app.kubernetes.io/managed-by": "gpushare-binder"},
            },
            "spec": {"nodeName": "old-node"},
        },
    )
    await report(js, clock)
    await start_binder(**FAST_DEVICES)
    await eventually(lambda: device(kube_api, "old-node") is None)
    await eventually(lambda: status_is(kube_api, cardCount=2))


async def test_without_the_crd_the_binder_still_binds(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    await report(js, clock)
    binder = await start_binder(**FAST_DEVICES)
    await eventually(lambda: binder.devices.crd_missing)
    pod = create_pod(kube_api, "p1")
    await reserve(js, clock, pod)
    await eventually(lambda: (kube_api.get("pods", "p1", "ns") or {})["spec"].get("nodeName"))


async def test_sync_devices_off_writes_no_device(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    await report(js, clock)
    binder: Binder = await start_binder(sync_devices=False)
    pod = create_pod(kube_api, "p1")
    await reserve(js, clock, pod)
    await eventually(lambda: (kube_api.get("pods", "p1", "ns") or {})["spec"].get("nodeName"))
    assert binder.devices.writes == 0
    assert device(kube_api) is None


async def test_resync_puts_a_deleted_device_back_while_heartbeats_keep_coming(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    await report(js, clock)
    await start_binder(device_sync_interval_s=0.02, device_resync_s=0.3)
    await eventually(lambda: status_is(kube_api, cardCount=2))
    kube_api.delete(DEVICES, NODE)

    async def heartbeats() -> None:
        while True:
            clock.advance(1)
            await report(js, clock)
            await asyncio.sleep(0.01)

    beating = asyncio.create_task(heartbeats())
    try:
        await eventually(lambda: status_is(kube_api, cardCount=2))
    finally:
        await cancel_and_wait(beating)  # a plain cancel can be lost inside a publish


async def test_a_node_gone_from_the_api_and_silent_loses_its_device_until_it_reports(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    install_crd(kube_api)
    await report(js, clock)
    binder = await start_binder(**FAST_DEVICES)
    await eventually(lambda: status_is(kube_api, cardCount=2))
    clock.advance(3600)  # the node is in no Node list of the API, and silent for an hour
    await binder.devices.resync()
    assert device(kube_api) is None
    await binder.devices.resync()
    assert device(kube_api) is None  # not written again by the next pass
    await report(js, clock)
    await eventually(lambda: status_is(kube_api, cardCount=2))
