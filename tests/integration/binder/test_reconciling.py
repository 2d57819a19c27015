"""Reconciliation against the Kubernetes API stand-in and a real nats-server: annotated
pods the log lost are adopted, allocations of vanished pods and nodes released, and a
second pass appends nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import msgspec
import pytest
from nats.js import JetStreamContext

from gpushare.binder.reconciling import Reconciler
from gpushare.binder.watched_pods import WatchedPods
from gpushare.bus.follow import LogFollower
from gpushare.bus.log import AllocationLog
from gpushare.core.annotations import ALLOCATION, ASSIGNED, IDX, POD, binding_annotations
from gpushare.core.events import (
    ContainerAssigned,
    DiscrepancyFound,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.model import ContainerShare, PodRef
from gpushare.core.reconciliation import ADOPTED_POLICY, adopted_id
from gpushare.core.state import fold_events
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from gpushare.kube.pods import list_pods
from tests.fakes import FakeClock
from tests.integration.binder.conftest import FAST, StartBinder
from tests.integration.binder.test_binder import (
    CARD,
    NODE,
    logged,
    report_cards,
    wait_until_consumed,
)
from tests.integration.kube.waiting import eventually

MakeReconciler = Callable[..., Awaitable[Reconciler]]


@pytest.fixture
async def follower(js: JetStreamContext) -> AsyncIterator[LogFollower]:
    following = LogFollower(js)
    await following.start()
    await following.ready.wait()
    try:
        yield following
    finally:
        await following.stop()


@pytest.fixture
def make_reconciler(follower: LogFollower, kube: KubeClient, clock: FakeClock) -> MakeReconciler:
    async def make(**overrides: Any) -> Reconciler:
        return Reconciler(follower, kube, dataclasses.replace(FAST, **overrides), clock)

    return make


def lost_reservation(clock: FakeClock, uid: str, mib: int = 4096) -> PodReserved:
    """A reservation the binder bound once, whose events the log no longer has."""
    share = ContainerShare(container="main", card_index=0, card_uuid=CARD.uuid, memory_mib=mib)
    pod = PodRef(namespace="ns", name=f"pod-{uid}", uid=uid)
    return PodReserved(id=f"lost-{uid}", at=clock.now(), node=NODE, pod=pod, shares=(share,))


def running_pod(
    kube_api: KubeApiServer,
    name: str,
    annotations: Mapping[str, str],
    node: str = NODE,
    mib: int = 4096,
) -> PodRef:
    """A pod bound to ``node`` with ``annotations``, running (as the kubelet reports)."""
    container = {
        "name": "main",
        "image": "cuda",
        "resources": {"limits": {"aliyun.com/gpu-mem": str(mib)}},
    }
    manifest = {
        "metadata": {"name": name, "annotations": dict(annotations)},
        "spec": {"nodeName": node, "containers": [container]},
    }
    created = kube_api.create_pod(manifest, "ns")
    kube_api.set_pod_phase("ns", name, "Running")
    return PodRef(namespace="ns", name=name, uid=created["metadata"]["uid"])


def annotated_for(reservation: PodReserved) -> dict[str, str]:
    return binding_annotations(reservation, CARD.memory_mib, "MiB")


async def a_node_with_cards(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, follower: LogFollower
) -> None:
    """``NODE`` in the API, its cards reported and folded."""
    kube_api.create_node(NODE)
    await report_cards(js, clock)
    await eventually(lambda: follower.state.node(NODE).cards)


async def stream_end(js: JetStreamContext) -> int:
    return await AllocationLog(js).last_seq()


async def test_an_annotated_pod_missing_from_the_log_is_adopted(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    follower: LogFollower,
    make_reconciler: MakeReconciler,
) -> None:
    await a_node_with_cards(js, kube_api, clock, follower)
    lost = lost_reservation(clock, "x")
    pod = running_pod(kube_api, "pod-x", annotated_for(lost))
    reconciler = await make_reconciler()

    first = await reconciler.reconcile()

    types = [type(event) for event in first.appended]
    assert types == [PodReserved, PodBound, ContainerAssigned]
    reserved = first.appended[0]
    assert isinstance(reserved, PodReserved)
    assert (reserved.id, reserved.pod, reserved.policy) == (
        adopted_id(pod.uid, lost.id),
        pod,
        ADOPTED_POLICY,
    )
    allocation = follower.state.allocation(pod.uid)
    assert allocation is not None
    assert allocation.bound
    assert allocation.fully_assigned
    # what an allocator folding the log from scratch sees: the memory is used
    replayed = fold_events([pair async for pair in AllocationLog(js).read()])
    assert replayed.node(NODE).pods[pod.uid].shares == lost.shares
    assert follower.state.node(NODE).used_mib[CARD.uuid] == 4096

    end = await stream_end(js)
    second = await reconciler.reconcile()
    assert second.appended == ()
    assert await stream_end(js) == end


async def test_seed_000_keys_alone_are_adopted_on_the_card_they_name(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    follower: LogFollower,
    make_reconciler: MakeReconciler,
) -> None:
    await a_node_with_cards(js, kube_api, clock, follower)
    pod = running_pod(kube_api, "legacy", {IDX: "0", POD: "2048"}, mib=2048)

    await (await make_reconciler()).reconcile()

    assert follower.state.node(NODE).used_mib[CARD.uuid] == 2048
    allocation = follower.state.allocation(pod.uid)
    assert allocation is not None
    assert allocation.reservation_id == adopted_id(pod.uid, "idx0")


async def test_a_deleted_pods_allocation_is_released(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    follower: LogFollower,
    make_reconciler: MakeReconciler,
) -> None:
    kube_api.create_node(NODE)
    pod = running_pod(kube_api, "p1", {})
    reserved = msgspec.structs.replace(lost_reservation(clock, "p1"), pod=pod)
    log = AllocationLog(js)
    await log.append(reserved)
    bound = PodBound(id="b1", at=clock.now(), node=NODE, pod=pod, reservation_id=reserved.id)
    await log.append(bound)
    await eventually(lambda: follower.state.allocation(pod.uid) is not None)
    reconciler = await make_reconciler()
    assert (await reconciler.reconcile()).appended == ()  # the pod is there: nothing to do

    kube_api.delete("pods", pod.name, pod.namespace)
    (released,) = (await reconciler.reconcile()).appended

    assert isinstance(released, PodReleased)
    assert (released.reason, released.reservation_id) == ("reconciled", reserved.id)
    assert follower.state.allocation(pod.uid) is None
    end = await stream_end(js)
    assert (await reconciler.reconcile()).appended == ()
    assert await stream_end(js) == end


async def test_a_removed_nodes_allocations_are_released_once_its_reporter_is_silent(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    follower: LogFollower,
    make_reconciler: MakeReconciler,
) -> None:
    kube_api.create_node(NODE)
    await report_cards(js, clock)
    lost = lost_reservation(clock, "y")
    pod = running_pod(kube_api, "pod-y", annotated_for(lost))
    reconciler = await make_reconciler()
    await reconciler.reconcile()
    assert follower.state.allocation(pod.uid) is not None

    kube_api.delete("nodes", NODE)
    assert (await reconciler.reconcile()).appended == ()  # its reporter still heartbeats
    clock.advance(60)  # three heartbeats (5 s) missed
    (released,) = (await reconciler.reconcile()).appended

    assert isinstance(released, PodReleased)
    assert released.reason == "node_removed"
    assert follower.state.node(NODE).used_mib.get(CARD.uuid, 0) == 0
    end = await stream_end(js)
    assert (await reconciler.reconcile()).appended == ()  # not adopted again
    assert await stream_end(js) == end


def node_lists(kube_api: KubeApiServer) -> int:
    return sum("watch=" not in r.query for r in kube_api.requests("GET", r"^/api/v1/nodes\b"))


async def test_a_probe_lists_nodes_only_while_a_reporter_is_silent(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    kube: KubeClient,
    clock: FakeClock,
    follower: LogFollower,
) -> None:
    kube_api.create_node(NODE)
    await report_cards(js, clock)
    pod = running_pod(kube_api, "pod-z", annotated_for(lost_reservation(clock, "z")))
    watched = WatchedPods(follower)
    reconciler = Reconciler(follower, kube, FAST, clock, watched=watched)
    await reconciler.reconcile()  # adopts, then the next pass marks it assigned
    await reconciler.reconcile()
    watched.replace((await list_pods(kube)).items)  # as the watch shows it then
    assert follower.state.allocation(pod.uid) is not None
    lists = node_lists(kube_api)
    assert not await reconciler.probe()

    kube_api.delete("nodes", NODE)
    assert not await reconciler.probe()  # its reporter still heartbeats
    assert node_lists(kube_api) == lists
    clock.advance(60)  # three heartbeats (5 s) missed
    assert await reconciler.probe()
    assert node_lists(kube_api) == lists + 1
    (released,) = (await reconciler.reconcile()).appended
    assert isinstance(released, PodReleased)
    assert released.reason == "node_removed"


async def test_a_lost_race_is_decided_again_on_the_nodes_newest_events(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    follower: LogFollower,
    make_reconciler: MakeReconciler,
) -> None:
    await a_node_with_cards(js, kube_api, clock, follower)
    lost = lost_reservation(clock, "z")
    pod = running_pod(kube_api, "pod-z", annotated_for(lost))
    await follower.stop()  # the fold falls behind: another allocator reserves meanwhile
    other = lost_reservation(clock, "other", mib=1024)
    await AllocationLog(js).append(other)

    first = await (await make_reconciler()).reconcile()

    assert [type(event) for event in first.appended] == [PodReserved, PodBound, ContainerAssigned]
    node = follower.state.node(NODE)
    assert set(node.pods) == {pod.uid, "other"}
    assert node.used_mib[CARD.uuid] == 4096 + 1024
    reservations = [e for e in await logged(js) if isinstance(e, PodReserved)]
    assert [e.pod.uid for e in reservations] == ["other", pod.uid]


async def test_disagreements_are_recorded_once_and_never_crash_a_pass(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    follower: LogFollower,
    make_reconciler: MakeReconciler,
) -> None:
    kube_api.create_node(NODE)
    running_pod(kube_api, "broken", {ALLOCATION: "{not json"})
    elsewhere = annotated_for(msgspec.structs.replace(lost_reservation(clock, "w"), node="other"))
    running_pod(kube_api, "misplaced", elsewhere)
    reconciler = await make_reconciler()

    first = await reconciler.reconcile()

    found = sorted(
        (e.pod.name, e.kind) for e in first.appended if isinstance(e, DiscrepancyFound) and e.pod
    )
    assert found == [("broken", "annotation_mismatch"), ("misplaced", "annotation_mismatch")]
    assert len(first.appended) == 2
    end = await stream_end(js)
    assert (await reconciler.reconcile()).appended == ()
    assert await stream_end(js) == end


async def test_the_binder_adopts_at_start_without_binding_again(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    kube_api.create_node(NODE)
    await report_cards(js, clock)
    lost = lost_reservation(clock, "s")
    pod = running_pod(kube_api, "pod-s", annotated_for(lost))

    binder = await start_binder()

    await eventually(lambda: binder.follower.state.allocation(pod.uid) is not None)
    await wait_until_consumed(js)  # the binding worker saw the adoption, and let it be
    assert kube_api.requests("POST", "/binding$") == []
    types = [type(event) for event in await logged(js)]
    assert types == [PodReserved, PodBound, ContainerAssigned]


async def test_passes_also_run_every_reconcile_interval(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    kube_api.create_node(NODE)
    await report_cards(js, clock)
    binder = await start_binder(reconcile_interval_s=0.05)
    await binder.releaser.synced.wait()
    lost = lost_reservation(clock, "t")
    pod = running_pod(kube_api, "pod-t", annotated_for(lost))  # the watch adopts nothing

    await eventually(lambda: binder.follower.state.allocation(pod.uid) is not None)
    # at start, then the one the watched pod called for; a pass is counted once it has
    # applied everything, after the adoption it appended may already be folded
    await eventually(lambda: binder.reconciler.passes >= 2)


def pod_lists(kube_api: KubeApiServer) -> int:
    return sum("watch=" not in r.query for r in kube_api.requests("GET", r"^/api/v1/pods\b"))


async def test_periodic_passes_list_pods_only_when_the_watched_pods_call_for_it(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    kube_api.create_node(NODE)
    await report_cards(js, clock)
    running_pod(kube_api, "other", {})  # a pod of another scheduler's, with a GPU
    binder = await start_binder(reconcile_interval_s=0.02)
    await binder.releaser.synced.wait()
    reconciler = binder.reconciler
    probes = reconciler.probes
    await eventually(lambda: reconciler.probes >= probes + 5)
    assert (reconciler.passes, pod_lists(kube_api)) == (1, 1)  # the start-up list only

    pod = running_pod(kube_api, "pod-w", annotated_for(lost_reservation(clock, "w")))
    await eventually(lambda: binder.follower.state.allocation(pod.uid) is not None)

    def marked_assigned() -> bool:  # by the marker or a pass's repair, as the watch shows
        kept = [p for p in binder.watched.pods() if p.metadata.uid == pod.uid]
        return bool(kept) and kept[0].annotations.get(ASSIGNED) == "true"

    await eventually(marked_assigned)
    await eventually(lambda: pod_lists(kube_api) == reconciler.passes)  # no pass in flight
    passes = reconciler.passes
    assert passes >= 2  # adopted from a new list (and maybe repaired from another)
    probes = reconciler.probes
    await eventually(lambda: reconciler.probes >= probes + 5)
    assert (reconciler.passes, pod_lists(kube_api)) == (passes, passes)

    kube_api.delete("pods", pod.name, pod.namespace)  # the watch releases it
    await eventually(lambda: binder.follower.state.allocation(pod.uid) is None)
    await eventually(lambda: pod_lists(kube_api) == reconciler.passes)
    passes = reconciler.passes  # one more if a probe came between the watch and the fold
    probes = reconciler.probes
    await eventually(lambda: reconciler.probes >= probes + 5)
    assert (reconciler.passes, pod_lists(kube_api)) == (passes, passes)
