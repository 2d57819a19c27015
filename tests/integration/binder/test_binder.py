"""The binder end to end: a real nats-server, the Kubernetes API stand-in, a fake clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TypeVar

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from gpushare.binder.service import Binder
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.bus.permissions import BINDER_CONSUMER
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    BINDER_QUEUE_STREAM,
    BINDER_WORK,
    allocation_subject,
)
from gpushare.core.annotations import ALLOCATION, ASSIGNED, ASSUME_TIME, DEV, IDX, POD, RESERVATION
from gpushare.core.events import (
    AnyEvent,
    BindFailed,
    ContainerAssigned,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
    encode_event,
)
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.embedded.kube_api import KubeApiServer
from tests.fakes import FakeClock
from tests.integration.binder.conftest import FAST, StartBinder
from tests.integration.kube.waiting import POLL_S, eventually

NODE = "gpu-a.example"
CARD = Card(index=0, uuid="GPU-0", model="Tesla T4", memory_mib=15360)
BROKEN = Card(index=1, uuid="GPU-1", model="Tesla T4", memory_mib=15360, healthy=False)
ONE_CONTAINER = {"main": 1024}

E = TypeVar("E", bound=AnyEvent)


async def report_cards(js: JetStreamContext, clock: FakeClock, *cards: Card) -> None:
    event = InventoryReported(
        id=f"inventory-{NODE}-{clock.now().timestamp()}",
        at=clock.now(),
        node=NODE,
        cards=cards or (CARD,),
        source="fixture",
        heartbeat_seconds=5,
    )
    await publish_inventory(js, event)


def create_pod(
    kube_api: KubeApiServer, name: str, containers: Mapping[str, int] = ONE_CONTAINER
) -> PodRef:
    spec = {
        "containers": [
            {
                "name": container,
                "image": "cuda",
                "resources": {"limits": {"aliyun.com/gpu-mem": str(mib)}},
            }
            for container, mib in containers.items()
        ]
    }
    created = kube_api.create_pod({"metadata": {"name": name}, "spec": spec}, "ns")
    return PodRef(namespace="ns", name=name, uid=created["metadata"]["uid"])


def reservation(
    clock: FakeClock, pod: PodRef, containers: Mapping[str, int] = ONE_CONTAINER
) -> PodReserved:
    shares = tuple(
        ContainerShare(container=name, card_index=0, card_uuid=CARD.uuid, memory_mib=mib)
        for name, mib in containers.items()
    )
    return PodReserved(
        id=f"reserve-{pod.uid}",
        at=clock.now(),
        node=NODE,
        pod=pod,
        shares=shares,
        reserved_by="test",
    )


async def reserve(
    js: JetStreamContext,
    clock: FakeClock,
    pod: PodRef,
    containers: Mapping[str, int] = ONE_CONTAINER,
) -> PodReserved:
    event = reservation(clock, pod, containers)
    await AllocationLog(js).append(event)
    return event


async def logged(js: JetStreamContext) -> list[AnyEvent]:
    return [event async for _, event in AllocationLog(js).read_node(NODE, 0)]


async def first_logged(js: JetStreamContext, kind: type[E], within: float = 20.0) -> E:
    """The first event of ``kind`` in the node's log, once there is one."""
    for _ in range(int(within / POLL_S)):
        found = [event for event in await logged(js) if isinstance(event, kind)]
        if found:
            return found[0]
        await asyncio.sleep(POLL_S)
    raise AssertionError(f"no {kind.__name__} in the log: {await logged(js)}")


async def pod_annotations(kube_api: KubeApiServer, pod: PodRef) -> dict[str, str]:
    stored = kube_api.get("pods", pod.name, pod.namespace)
    assert stored is not None
    return dict(stored["metadata"].get("annotations") or {})


async def bound_pod(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    name: str = "p1",
    containers: Mapping[str, int] = ONE_CONTAINER,
) -> tuple[PodRef, PodReserved]:
    pod = create_pod(kube_api, name, containers)
    reserved = await reserve(js, clock, pod, containers)
    await first_logged(js, PodBound)
    return pod, reserved


def bound_in_fold(binder: Binder, pod: PodRef) -> bool:
    allocation = binder.follower.state.allocation(pod.uid)
    return allocation is not None and allocation.bound


async def test_a_reservation_is_bound_with_its_annotations(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await report_cards(js, clock)
    pod = create_pod(kube_api, "p1")
    reserved = await reserve(js, clock, pod)
    bound = await first_logged(js, PodBound)
    assert (bound.reservation_id, bound.pod, bound.node) == (reserved.id, pod, NODE)
    stored = kube_api.get("pods", "p1", "ns")
    assert stored is not None
    assert stored["spec"]["nodeName"] == NODE
    annotations = stored["metadata"]["annotations"]
    assert annotations[IDX] == "0"
    assert annotations[POD] == "1024"
    assert annotations[DEV] == "15360"
    assert annotations[ASSUME_TIME] == str(int(reserved.at.timestamp()) * 1_000_000_000)
    assert annotations[ASSIGNED] == "false"
    assert annotations[RESERVATION] == reserved.id
    allocation = json.loads(annotations[ALLOCATION])
    assert allocation["node"] == NODE
    assert allocation["reservation"] == reserved.id
    assert allocation["containers"]["main"][0]["card_uuid"] == CARD.uuid
    await eventually(lambda: bound_in_fold(binder, pod))


async def test_a_pod_deleted_before_binding_fails_the_bind(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    pod = create_pod(kube_api, "p1")
    kube_api.delete("pods", "p1", "ns")
    await reserve(js, clock, pod)
    failed = await first_logged(js, BindFailed)
    assert 'pods "p1" not found' in failed.reason
    await eventually(lambda: binder.follower.state.allocation(pod.uid) is None)


async def test_an_injected_conflict_fails_the_bind(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    kube_api.fail_next("POST", "/binding$", 409, 'pod p1 is already assigned to node "other"')
    pod = create_pod(kube_api, "p1")
    await reserve(js, clock, pod)
    failed = await first_logged(js, BindFailed)
    assert 'already assigned to node "other"' in failed.reason
    assert not [event for event in await logged(js) if isinstance(event, PodBound)]


async def test_a_temporary_error_is_retried_until_bound(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    kube_api.fail_next("POST", "/binding$", 500, "etcdserver: request timed out")
    pod = create_pod(kube_api, "p1")
    await reserve(js, clock, pod)
    await first_logged(js, PodBound)
    assert [r.status for r in kube_api.requests("POST", "/binding$")] == [500, 201]


async def test_persistent_temporary_errors_give_up_with_bind_failed(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    kube_api.fail_next("POST", "/binding$", 503, "the API is down", times=-1)
    pod = create_pod(kube_api, "p1")
    await reserve(js, clock, pod)
    failed = await first_logged(js, BindFailed)
    assert failed.reason == "gave up after 3 attempts: the API is down"


async def test_the_same_reservation_delivered_twice_binds_once(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    pod = create_pod(kube_api, "p1")
    reserved = reservation(clock, pod)
    for copy in ("first", "second"):  # two messages, as a redelivery or a replayed append
        headers = {"Nats-Msg-Id": f"{reserved.id}-{copy}"}
        await js.publish(allocation_subject(NODE), encode_event(reserved), headers=headers)
    await first_logged(js, PodBound)
    await wait_until_consumed(js)
    assert len([e for e in await logged(js) if isinstance(e, PodBound)]) == 1
    assert len(kube_api.requests("POST", "/binding$", status=201)) == 1


async def test_a_malformed_message_is_terminated_and_work_goes_on(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    # On another node's subject: AllocationLog.read_node (used by logged()) raises on it.
    await js.publish(allocation_subject("elsewhere"), b"{not json")
    pod = create_pod(kube_api, "p1")
    await reserve(js, clock, pod)
    await first_logged(js, PodBound)
    await wait_until_consumed(js)
    info = await js.consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)
    assert info.num_redelivered == 0


async def test_a_deleted_pod_is_released(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await binder.releaser.synced.wait()
    pod, reserved = await bound_pod(js, kube_api, clock)
    kube_api.delete("pods", pod.name, pod.namespace)
    released = await first_logged(js, PodReleased)
    assert (released.reason, released.reservation_id) == ("deleted", reserved.id)


async def test_a_release_tells_kube_scheduler_twice_through_the_nodes_annotations(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    """At once, and again a moment later for the allocators that fold it late: each
    write changes the annotation, which is what makes kube-scheduler retry its pods."""
    kube_api.create_node(NODE)
    await binder.releaser.synced.wait()
    pod, _ = await bound_pod(js, kube_api, clock)
    seen: list[str] = []

    def told() -> str | None:
        node = kube_api.get("nodes", NODE)
        assert node is not None
        value = (node["metadata"].get("annotations") or {}).get("gpushare.io/released")
        if value and value not in seen:
            seen.append(value)
        return value

    kube_api.delete("pods", pod.name, pod.namespace)
    released = await first_logged(js, PodReleased)
    await eventually(lambda: told() == released.id)
    await eventually(lambda: told() == f"{released.id}/again", within=10)
    assert seen == [released.id, f"{released.id}/again"]


async def test_a_finished_pod_is_released(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await binder.releaser.synced.wait()
    pod, _ = await bound_pod(js, kube_api, clock)
    kube_api.set_pod_phase(pod.namespace, pod.name, "Succeeded")
    released = await first_logged(js, PodReleased)
    assert (released.reason, released.detail) == ("terminated", "Succeeded")


async def test_allocations_of_vanished_pods_are_released_at_start(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    gone = PodRef(namespace="ns", name="gone", uid="uid-gone")
    reserved = reservation(clock, gone)
    log = AllocationLog(js)
    await log.append(reserved)
    await log.append(
        PodBound(id="bound-gone", at=clock.now(), node=NODE, pod=gone, reservation_id=reserved.id)
    )
    await start_binder()
    released = await first_logged(js, PodReleased)
    assert (released.reason, released.reservation_id) == ("reconciled", reserved.id)


async def test_a_reservation_not_bound_in_time_is_released(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    binder = await start_binder(bind_attempts=1_000_000)
    kube_api.fail_next("POST", "/binding$", 503, times=-1)
    pod = create_pod(kube_api, "p1")
    reserved = await reserve(js, clock, pod)
    await eventually(lambda: binder.follower.state.allocation(pod.uid) is not None)
    assert await binder.sweeper.sweep() == 0  # not overdue yet
    clock.advance(121)
    released = await first_logged(js, PodReleased)
    assert (released.reason, released.reservation_id) == ("bind_timeout", reserved.id)


async def assign(
    js: JetStreamContext, clock: FakeClock, pod: PodRef, reserved: PodReserved, *containers: str
) -> None:
    """The node agent's ``ContainerAssigned`` for each of ``containers``, on ``CARD``."""
    log = AllocationLog(js)
    for container in containers:
        await log.append(
            ContainerAssigned(
                id=f"assigned-{pod.name}-{container}",
                at=clock.now(),
                node=NODE,
                pod=pod,
                reservation_id=reserved.id,
                container=container,
                card_uuids=(CARD.uuid,),
            )
        )


async def marked(kube_api: KubeApiServer, pod: PodRef) -> bool:
    return (await pod_annotations(kube_api, pod)).get(ASSIGNED) == "true"


async def until_marked(kube_api: KubeApiServer, pod: PodRef) -> None:
    for _ in range(1000):
        if await marked(kube_api, pod):
            return
        await asyncio.sleep(POLL_S)
    raise AssertionError(f"{pod.key} was never marked {ASSIGNED}=true")


def patches_of(kube_api: KubeApiServer, pod: PodRef) -> int:
    return len(kube_api.requests("PATCH", f"/namespaces/{pod.namespace}/pods/{pod.name}$"))


async def test_a_fully_assigned_pod_is_marked_assigned(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    containers = {"main": 1024, "sidecar": 512}
    pod, reserved = await bound_pod(js, kube_api, clock, containers=containers)
    for container in containers:
        assert (await pod_annotations(kube_api, pod))[ASSIGNED] == "false"
        await assign(js, clock, pod, reserved, container)
    await until_marked(kube_api, pod)
    clock.advance(3600)
    assert await binder.sweeper.sweep() == 0  # fully assigned pods never time out


async def test_a_mark_that_failed_is_tried_again_at_the_next_sweep(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    pod, reserved = await bound_pod(js, kube_api, clock)
    kube_api.fail_next("PATCH", f"/pods/{pod.name}$", 503)
    await assign(js, clock, pod, reserved, *ONE_CONTAINER)
    await until_marked(kube_api, pod)
    assert [r.status for r in kube_api.requests("PATCH", f"/pods/{pod.name}$")] == [503, 200]


async def test_a_restarted_binder_does_not_mark_a_marked_pod_again(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    first = await start_binder()
    pod, reserved = await bound_pod(js, kube_api, clock)
    await assign(js, clock, pod, reserved, *ONE_CONTAINER)
    await until_marked(kube_api, pod)
    await first.stop()
    patched = patches_of(kube_api, pod)

    second = await start_binder()
    await second.releaser.synced.wait()
    for _ in range(20):  # a few sweeps of the marker
        await asyncio.sleep(FAST.sweep_interval_s)
    assert patches_of(kube_api, pod) == patched
    assert await marked(kube_api, pod)


async def test_gpu_count_follows_the_healthy_cards(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await report_cards(js, clock, CARD, BROKEN)  # the node is not registered yet: skipped
    await eventually(lambda: NODE in binder.capacity.missing)
    kube_api.create_node(NODE, capacity={"cpu": "8"})
    clock.advance(1)
    await report_cards(js, clock, CARD, BROKEN)
    await eventually(lambda: binder.capacity.written(NODE) == 1)
    node = kube_api.get("nodes", NODE)
    assert node is not None
    assert node["status"]["capacity"]["aliyun.com/gpu-count"] == "1"
    assert node["status"]["allocatable"]["aliyun.com/gpu-count"] == "1"
    assert node["status"]["capacity"]["cpu"] == "8"


async def wait_until_consumed(js: JetStreamContext) -> None:
    """Until the binder's consumer has acknowledged everything in the stream."""
    for _ in range(1000):
        info = await js.consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await asyncio.sleep(POLL_S)
    raise AssertionError("the binder did not finish the stream")


async def test_the_binders_consumer_is_delivered_reservations_not_the_binders_own_events(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await report_cards(js, clock)
    await bound_pod(js, kube_api, clock)
    for _ in range(int(5 / POLL_S)):  # the PodBound is sourced into the binders' queue too
        if (await js.stream_info(BINDER_QUEUE_STREAM)).state.messages >= 2:
            break
        await asyncio.sleep(POLL_S)
    else:
        raise AssertionError("the PodBound never reached the binders' queue")
    await wait_until_consumed(js)  # were the PodBound the consumer's, it is delivered by now
    info = await js.consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)
    assert info.config.filter_subjects == list(BINDER_WORK)
    assert info.delivered.consumer_seq == 1  # the reservation; not the PodBound after it
    assert info.num_pending == 0


async def test_a_consumer_an_older_binder_made_is_narrowed_and_keeps_its_settings(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    old = ConsumerConfig(
        durable_name=BINDER_CONSUMER,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=77,
        max_deliver=-1,
        filter_subject=ALL_ALLOCATIONS,
    )
    await js.add_consumer(BINDER_QUEUE_STREAM, old)
    await start_binder()
    info = await js.consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)
    assert info.config.filter_subjects == list(BINDER_WORK)
    assert info.config.ack_wait == 77
    await report_cards(js, clock)
    await bound_pod(js, kube_api, clock)
