"""Never release what the kubelet holds: a bound pod past ``--assign-timeout`` keeps its
reservation while it exists and has not finished (reported once), and is released when it
is gone; a reservation never bound is still released after ``--bind-timeout``. A real
nats-server, the Kubernetes API stand-in, a fake clock."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from gpushare.binder.decisions import Sighting
from gpushare.binder.releasing import OverdueSweeper, Releases
from gpushare.binder.service import Binder
from gpushare.binder.sighting import PodSightings
from gpushare.bus.follow import LogFollower
from gpushare.bus.log import AllocationLog
from gpushare.core.events import DiscrepancyFound, PodBound, PodReleased
from gpushare.core.model import PodRef
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from tests.fakes import FakeClock
from tests.integration.binder.conftest import FAST, StartBinder
from tests.integration.binder.test_binder import (
    NODE,
    bound_in_fold,
    bound_pod,
    create_pod,
    first_logged,
    logged,
    report_cards,
    reservation,
    reserve,
)
from tests.integration.binder.test_reconciling import running_pod
from tests.integration.kube.waiting import eventually

ASSIGN_TIMEOUT_S = 600
RUNNING = Sighting(present=True, node=NODE, phase="Running")


def overdue_gauge() -> float | None:
    return REGISTRY.get_sample_value("gpushare_binder_assign_overdue")


async def records(js: JetStreamContext, kind: str) -> list[DiscrepancyFound]:
    return [e for e in await logged(js) if isinstance(e, DiscrepancyFound) and e.kind == kind]


async def test_a_running_pod_never_assigned_keeps_its_reservation_until_it_is_deleted(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await report_cards(js, clock)
    await binder.releaser.synced.wait()
    pod, reserved = await bound_pod(js, kube_api, clock)
    await eventually(lambda: bound_in_fold(binder, pod))
    kube_api.set_pod_phase(pod.namespace, pod.name, "Running")  # admitted; Allocate never logged
    await eventually(lambda: binder.sightings.get(pod.uid) == RUNNING)

    clock.advance(ASSIGN_TIMEOUT_S + 1)
    assert await binder.sweeper.sweep() == 0
    found = await first_logged(js, DiscrepancyFound)
    assert (found.kind, found.pod, found.reservation_id) == ("assign_overdue", pod, reserved.id)
    assert "the pod is Running, containers waiting: main" in found.detail
    for _ in range(5):  # the sweep loop goes on: still kept, still reported once
        await asyncio.sleep(FAST.sweep_interval_s)
        assert await binder.sweeper.sweep() == 0
    allocation = binder.follower.state.allocation(pod.uid)
    assert allocation is not None
    assert allocation.reservation_id == reserved.id
    assert len(await records(js, "assign_overdue")) == 1
    assert not [e for e in await logged(js) if isinstance(e, PodReleased)]
    assert set(binder.sweeper.overdue) == {reserved.id}
    assert overdue_gauge() == 1

    kube_api.delete("pods", pod.name, pod.namespace)
    released = await first_logged(js, PodReleased)
    assert (released.reason, released.reservation_id) == ("deleted", reserved.id)
    await eventually(lambda: binder.follower.state.allocation(pod.uid) is None)
    await binder.sweeper.sweep()
    assert binder.sweeper.overdue == {}
    assert overdue_gauge() == 0


async def test_a_pending_pod_never_bound_is_still_released_after_the_bind_timeout(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    binder = await start_binder(bind_attempts=1_000_000)
    kube_api.fail_next("POST", "/binding$", 503, times=-1)  # the binding never lands
    pod = create_pod(kube_api, "p1")
    reserved = await reserve(js, clock, pod)
    await eventually(lambda: binder.follower.state.allocation(pod.uid) is not None)
    stored = kube_api.get("pods", pod.name, pod.namespace)
    assert stored is not None
    assert stored.get("status", {}).get("phase", "Pending") == "Pending"
    assert await binder.sweeper.sweep() == 0  # not overdue yet

    clock.advance(121)

    released = await first_logged(js, PodReleased)
    assert (released.reason, released.reservation_id) == ("bind_timeout", reserved.id)
    assert await records(js, "assign_overdue") == []


# --- the sweep alone: what it knows of a pod it has never seen bound ---------------------


@pytest.fixture
async def follower(js: JetStreamContext) -> AsyncIterator[LogFollower]:
    following = LogFollower(js, writer="binder")
    await following.start()
    await following.ready.wait()
    try:
        yield following
    finally:
        await following.stop()


def sweeper_of(
    follower: LogFollower, kube: KubeClient, clock: FakeClock
) -> tuple[OverdueSweeper, PodSightings]:
    sightings = PodSightings(kube)
    settings = dataclasses.replace(FAST, assign_timeout_s=ASSIGN_TIMEOUT_S)
    return OverdueSweeper(
        follower, settings, clock, Releases(follower, clock), sightings
    ), sightings


async def bound_in_log(js: JetStreamContext, clock: FakeClock, pod: PodRef) -> str:
    reserved = reservation(clock, pod)
    log = AllocationLog(js)
    await log.append(reserved)
    await log.append(
        PodBound(
            id=f"{reserved.id}.bound",
            at=clock.now(),
            node=reserved.node,
            pod=pod,
            reservation_id=reserved.id,
        )
    )
    return reserved.id


def bound_in(follower: LogFollower, uid: str) -> bool:
    allocation = follower.state.allocation(uid)
    return allocation is not None and allocation.bound


async def test_a_pod_not_seen_since_binding_is_read_before_anything_is_decided(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    kube: KubeClient,
    clock: FakeClock,
    follower: LogFollower,
) -> None:
    running = running_pod(kube_api, "running", {})  # bound to NODE, Running
    gone = PodRef(namespace="ns", name="gone", uid="uid-gone")
    kept, lost = await bound_in_log(js, clock, running), await bound_in_log(js, clock, gone)
    await eventually(lambda: all(bound_in(follower, uid) for uid in (running.uid, gone.uid)))
    sweeper, sightings = sweeper_of(follower, kube, clock)

    clock.advance(ASSIGN_TIMEOUT_S - 1)
    assert await sweeper.sweep() == 0
    assert sightings.reads == 0  # nothing to decide yet: nothing read

    clock.advance(2)
    assert await sweeper.sweep() == 1  # the pod the API does not have

    assert sightings.reads == 2
    released = await first_logged(js, PodReleased)
    assert (released.reservation_id, released.reason) == (lost, "deleted")
    await eventually(lambda: follower.state.allocation(gone.uid) is None)
    assert follower.state.allocation(running.uid) is not None
    (found,) = await records(js, "assign_overdue")
    assert found.reservation_id == kept
    assert await sweeper.sweep() == 0
    assert sightings.reads == 2  # what it read is remembered
    assert len(await records(js, "assign_overdue")) == 1  # reported once
