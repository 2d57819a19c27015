"""The node agent's reconciliation on real sockets and a real nats-server: cards other
device plugins' pods hold become ``ForeignCardsHeld`` (and the allocator's fold refuses
them), a container on other cards than the log says is ``AllocationCorrected``, the
rest is ``DiscrepancyFound``, each recorded once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import TypeVar

import pytest
from nats.js import JetStreamContext

from gpushare.bus.follow import LogFollower
from gpushare.core.events import (
    AllocationCorrected,
    AnyEvent,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
)
from gpushare.core.fit import check_fit
from gpushare.core.requests import read_gpu_request
from gpushare.embedded.kubelet import AdmittedPod, ContainerDevices, EmbeddedKubelet
from gpushare.node_agent.agent import NodeAgent
from gpushare.node_agent.settings import NodeTarget
from tests.integration.kube.waiting import eventually
from tests.integration.node_agent.conftest import FAST, StartAgent, StartKubelet
from tests.integration.node_agent.logbook import RESOURCE, Logbook, gpu, pod_spec
from tests.unit.node_agent.builders import T0, at

E = TypeVar("E", bound=AnyEvent)

GPU0, GPU1 = gpu(0), gpu(1)
NVIDIA = "nvidia.com/gpu"
NOW = at(1) + timedelta(seconds=1)
"""Just after the first inventory (``Logbook.report`` stamps it ``at(1)``): fresh."""


def foreign_pod(uid: str, *device_ids: str, resource: str = NVIDIA) -> AdmittedPod:
    """A pod NVIDIA's device plugin served (this agent never saw its Allocate)."""
    devices = [ContainerDevices("cuda", resource, tuple(device_ids), {})]
    return AdmittedPod("ml", uid, uid, devices=devices, containers=("cuda",))


@pytest.fixture
async def allocator_fold(js: JetStreamContext) -> AsyncIterator[LogFollower]:
    """The fold an allocator keeps of every node (``gpushare.core.state`` over the log)."""
    follower = LogFollower(js)
    await follower.start()
    await follower.ready.wait()
    try:
        yield follower
    finally:
        await follower.stop()


async def started(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    start_kubelet: StartKubelet,
    **kubelet: bool,
) -> tuple[Logbook, EmbeddedKubelet, NodeAgent]:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    running = await start_kubelet(target, **kubelet)
    agent = await start_agent(target)
    await running.wait_for_devices(RESOURCE, lambda devices: len(devices) == 8192)
    return book, running, agent


async def logged(book: Logbook) -> list[AnyEvent]:
    return [event async for _, event in book.log.read_node(book.node, 0)]


def of_type(events: list[AnyEvent], kind: type[E]) -> list[E]:
    return [event for event in events if isinstance(event, kind)]


async def test_a_card_held_through_another_plugin_is_wholly_used_until_freed(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    start_kubelet: StartKubelet,
    allocator_fold: LogFollower,
) -> None:
    book, kubelet, agent = await started(js, target, start_agent, start_kubelet)
    await book.bind(await book.reserve("busy", [("c", GPU1, 3072, False)]))
    probe = read_gpu_request(pod_spec("probe", {"c": 2048}))  # only GPU0 has 2048 MiB free

    def fits() -> bool:
        return check_fit(allocator_fold.state.node("n1"), probe, NOW).fits

    await eventually(lambda: "busy" in allocator_fold.state.node("n1").pods)
    assert fits()

    kubelet.restore(foreign_pod("trainer", GPU0.uuid))
    await agent.check.check()

    (held,) = of_type(await logged(book), ForeignCardsHeld)
    assert held.holds == (ForeignHold(card_uuid=GPU0.uuid, resource=NVIDIA, pods=("ml/trainer",)),)
    await eventually(lambda: allocator_fold.state.node("n1").foreign)
    node = allocator_fold.state.node("n1")
    assert node.used_mib[GPU0.uuid] == GPU0.memory_mib
    assert not fits()
    assert "2048 MiB" in check_fit(node, probe, NOW).reason
    await agent.check.check()
    assert len(of_type(await logged(book), ForeignCardsHeld)) == 1  # unchanged: not again

    kubelet.release("trainer")
    await agent.check.check()

    freed = of_type(await logged(book), ForeignCardsHeld)[-1]
    assert freed.holds == ()
    await eventually(fits)
    assert allocator_fold.state.node("n1").used_mib.get(GPU0.uuid, 0) == 0


async def test_without_pod_resources_the_checkpoint_is_read_at_start(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    """An old-style MIG device names its card's UUID; the kubelet serves no pod-resources
    here, so a restarted agent reads the device checkpoint instead."""
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target, serve_pod_resources=False)
    kubelet.restore(foreign_pod("mig", f"MIG-{GPU1.uuid}/1/0", resource="nvidia.com/mig-1g.5gb"))

    agent = await start_agent(target, replace(FAST, reconcile_at_start=True))

    await eventually(lambda: agent.view.node.foreign)
    (hold,) = agent.view.node.foreign
    assert (hold.card_uuid, hold.resource, hold.pods) == (
        GPU1.uuid,
        "nvidia.com/mig-1g.5gb",
        ("mig",),
    )
    assert agent.check.last_error is not None
    assert agent.inspect()["pod_resources"]["foreign"]["source"] == "checkpoint"


async def test_a_foreign_card_we_also_reserved_is_an_overlap_recorded_once(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, kubelet, agent = await started(js, target, start_agent, start_kubelet)
    ours = await book.reserve("ours", [("c", GPU0, 1024, False)])
    await book.bind(ours)
    kubelet.restore(foreign_pod("theirs", GPU0.uuid.lower()))
    await agent.view.catch_up()

    await agent.check.check()
    await agent.check.check()

    (overlap,) = of_type(await logged(book), DiscrepancyFound)
    assert overlap.kind == "foreign_overlap"
    assert (overlap.pod, overlap.reservation_id) == (ours.pod, ours.id)
    assert "ml/theirs" in overlap.detail


async def test_a_container_on_another_card_is_corrected_to_what_the_kubelet_handed_out(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    start_kubelet: StartKubelet,
    allocator_fold: LogFollower,
) -> None:
    """The kubelet restored a pod from its checkpoint on GPU1 while the log says GPU0:
    the log follows the kubelet, and so does each card's memory."""
    book, kubelet, agent = await started(js, target, start_agent, start_kubelet)
    reserved = await book.reserve("p", [("c", GPU0, 1024, False)])
    await book.bind(reserved)
    assigned = ContainerAssigned(
        id="assigned-p", at=T0, node="n1", pod=reserved.pod, reservation_id=reserved.id,
        container="c", card_uuids=(GPU0.uuid,),
    )  # fmt: skip
    await book.log.append(assigned)
    on_gpu1 = agent.view.tables[RESOURCE].ids_of(GPU1)[:1024]
    devices = [ContainerDevices("c", RESOURCE, on_gpu1, {})]
    kubelet.restore(AdmittedPod("ns", "p", "p", devices=devices, containers=("c",)))
    await agent.view.catch_up()

    (finding,) = await agent.check.check()

    assert finding.kind == "card_mismatch"
    (corrected,) = of_type(await logged(book), AllocationCorrected)
    assert corrected.reservation_id == reserved.id
    assert [(s.card_uuid, s.card_index, s.memory_mib) for s in corrected.shares] == [
        (GPU1.uuid, 1, 1024)
    ]
    await eventually(lambda: allocator_fold.state.node("n1").used_mib.get(GPU1.uuid) == 1024)
    assert allocator_fold.state.node("n1").used_mib.get(GPU0.uuid, 0) == 0
    assert await agent.check.check() == ()  # the log agrees now
    assert len(of_type(await logged(book), AllocationCorrected)) == 1


async def test_swapped_same_size_pods_are_both_corrected(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, kubelet, agent = await started(js, target, start_agent, start_kubelet)
    await book.bind(await book.reserve("a", [("c", GPU0, 1024, False)], created=at(0)))
    await book.bind(await book.reserve("b", [("c", GPU1, 1024, False)], created=at(1)))
    # what the kubelet holds (from its checkpoint, say, while the agent was away): swapped
    table = agent.view.tables[RESOURCE]
    for uid, card in (("a", GPU1), ("b", GPU0)):
        held = [ContainerDevices("c", RESOURCE, table.ids_of(card)[:1024], {})]
        kubelet.restore(AdmittedPod("ns", uid, uid, devices=held, containers=("c",)))

    await agent.check.check()

    (swap,) = of_type(await logged(book), AllocationCorrected)  # both halves in one event
    moved = {c.pod.name: c.shares[0].card_uuid for c in swap.corrected()}
    assert moved == {"a": GPU1.uuid, "b": GPU0.uuid}
    pods = agent.view.node.pods
    assert (pods["a"].shares[0].card_uuid, pods["b"].shares[0].card_uuid) == (GPU1.uuid, GPU0.uuid)
    assert pods["a"].corrected
    assert await agent.check.check() == ()


async def test_ghosts_and_strangers_are_recorded_once_they_last(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, kubelet, agent = await started(js, target, start_agent, start_kubelet)
    ghost = await book.reserve("ghost", [("c", GPU1, 256, False)])
    await book.bind(ghost)
    await kubelet.admit(pod_spec("ghost", {"c": 256}))
    on_gpu0 = agent.view.tables[RESOURCE].ids_of(GPU0)[:256]
    stranger = [ContainerDevices("c", RESOURCE, on_gpu0, {})]
    kubelet.restore(AdmittedPod("ns", "stranger", "s", devices=stranger, containers=("c",)))
    await agent.check.check()
    assert of_type(await logged(book), DiscrepancyFound) == []  # one sighting is not enough
    kubelet.release("ghost")

    await agent.check.check()
    await agent.check.check()
    await agent.check.check()

    found = of_type(await logged(book), DiscrepancyFound)
    assert sorted((d.kind, d.reservation_id) for d in found) == [
        ("missing_from_kubelet", ghost.id),
        ("unknown_to_log", ""),
    ]
    assert all(d.reporter == "node-agent/n1" for d in found)
