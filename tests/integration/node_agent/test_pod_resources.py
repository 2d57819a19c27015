"""The pod-resources API of the test kubelet, and the agent's check of the log against it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import grpc
import pytest
from nats.js import JetStreamContext

from gpushare.embedded.kubelet import AdmittedPod, ContainerDevices, EmbeddedKubelet
from gpushare.kubelet_api.podresources.v1 import api_pb2 as pr
from gpushare.kubelet_api.podresources.v1 import api_pb2_grpc as pr_grpc
from gpushare.node_agent.agent import NodeAgent
from gpushare.node_agent.checkpoint import parse_checkpoint
from gpushare.node_agent.foreign import ForeignDevices
from gpushare.node_agent.registration import socket_address
from gpushare.node_agent.settings import NodeTarget
from tests.integration.node_agent.conftest import FAST, StartAgent, StartKubelet
from tests.integration.node_agent.logbook import RESOURCE, Logbook, gpu, pod_spec
from tests.unit.node_agent.builders import at

GPU0, GPU1 = gpu(0), gpu(1)


async def ready(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> tuple[Logbook, EmbeddedKubelet, NodeAgent]:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, lambda devices: len(devices) == 8192)
    return book, kubelet, agent


async def test_pod_resources_lists_what_the_kubelet_admitted(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, kubelet, _ = await ready(js, target, start_agent, start_kubelet)
    await book.bind(await book.reserve("p", [("c", GPU0, 256, False)]))
    admitted = await kubelet.admit(pod_spec("p", {"c": 256}))

    async with grpc.aio.insecure_channel(socket_address(target.pod_resources)) as channel:
        stub = pr_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        listed = await stub.List(pr.ListPodResourcesRequest())
        allocatable = await stub.GetAllocatableResources(pr.AllocatableResourcesRequest())
        one = await stub.Get(pr.GetPodResourcesRequest(pod_name="p", pod_namespace="ns"))
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.Get(pr.GetPodResourcesRequest(pod_name="nope", pod_namespace="ns"))

    (pod,) = listed.pod_resources
    assert (pod.namespace, pod.name) == ("ns", "p")
    (container,) = pod.containers
    (devices,) = container.devices
    assert devices.resource_name == RESOURCE
    assert set(devices.device_ids) == set(admitted.devices[0].device_ids)
    assert one.pod_resources == pod
    assert "not found" in (missing.value.details() or "")
    (every,) = [devices for devices in allocatable.devices if devices.resource_name == RESOURCE]
    assert len(every.device_ids) == 8192


async def test_a_restored_pod_is_listed_and_checkpointed_like_the_kubelets(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    """A pod served by a plugin this kubelet does not run (NVIDIA's, by card UUID)."""
    _, kubelet, _ = await ready(js, target, start_agent, start_kubelet)
    devices = [ContainerDevices("cuda", "nvidia.com/gpu", (GPU0.uuid,), {})]
    kubelet.restore(AdmittedPod("ml", "t", "uid-t", devices=devices, containers=("cuda",)))

    async with grpc.aio.insecure_channel(socket_address(target.pod_resources)) as channel:
        stub = pr_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        listed = await stub.List(pr.ListPodResourcesRequest())

    (pod,) = listed.pod_resources
    assert (pod.namespace, pod.name, pod.containers[0].name) == ("ml", "t", "cuda")
    (held,) = pod.containers[0].devices
    assert (held.resource_name, list(held.device_ids)) == ("nvidia.com/gpu", [GPU0.uuid])
    raw = target.checkpoint.read_bytes()
    assert json.loads(raw)["Data"]["RegisteredDevices"][RESOURCE]
    assert parse_checkpoint(raw, (RESOURCE,)) == [
        ForeignDevices("uid-t", "cuda", "nvidia.com/gpu", (GPU0.uuid,))
    ]
    kubelet.release("uid-t")
    assert parse_checkpoint(target.checkpoint.read_bytes(), ()) == []


async def test_agreement_finds_nothing(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, kubelet, agent = await ready(js, target, start_agent, start_kubelet)
    await book.bind(await book.reserve("p", [("c", GPU1, 256, False)]))
    await kubelet.admit(pod_spec("p", {"c": 256}))
    assert await agent.check.check() == ()
    assert agent.check.last_error is None


async def test_pods_admitted_out_of_creation_order_keep_their_cards_and_the_check_agrees(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    """Two same-size pods, both bound, admitted against creation order: pod-resources
    names the pod being admitted, so each gets the card the log gave it."""
    book, kubelet, agent = await ready(js, target, start_agent, start_kubelet)
    await book.bind(await book.reserve("a", [("c", GPU0, 1024, False)], created=at(0)))
    await book.bind(await book.reserve("b", [("c", GPU1, 1024, False)], created=at(1)))

    late = await kubelet.admit(pod_spec("b", {"c": 1024}))
    early = await kubelet.admit(pod_spec("a", {"c": 1024}))

    assert late.envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid
    assert early.envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU0.uuid
    assert await agent.check.check() == ()
    assert agent.check.mismatches_total == 0


async def test_a_swap_the_kubelet_restored_is_found_and_counted_once(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    """Assignments the kubelet holds from before (its checkpoint) with two same-size
    pods on each other's cards: the check says so, once."""
    book, kubelet, agent = await ready(js, target, start_agent, start_kubelet)
    await book.bind(await book.reserve("a", [("c", GPU0, 1024, False)], created=at(0)))
    await book.bind(await book.reserve("b", [("c", GPU1, 1024, False)], created=at(1)))
    table = agent.view.tables[RESOURCE]
    for uid, card in (("a", GPU1), ("b", GPU0)):
        held = [ContainerDevices("c", RESOURCE, table.ids_of(card)[:1024], {})]
        kubelet.restore(AdmittedPod("ns", uid, uid, devices=held, containers=("c",)))

    findings = await agent.check.check()

    assert sorted((f.kind, f.pod) for f in findings) == [
        ("card_mismatch", "ns/a"),
        ("card_mismatch", "ns/b"),
    ]
    assert agent.check.mismatches_total == 2
    await agent.check.check()
    assert agent.check.mismatches_total == 2  # counted once


async def test_released_too_early_and_ghosts_are_reported(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, kubelet, agent = await ready(js, target, start_agent, start_kubelet)
    early = await book.reserve("early", [("c", GPU0, 256, False)])
    await book.bind(early)
    await book.bind(await book.reserve("ghost", [("c", GPU1, 256, False)]))
    await kubelet.admit(pod_spec("early", {"c": 256}))
    await kubelet.admit(pod_spec("ghost", {"c": 256}))
    await book.release(early)
    await agent.view.catch_up()
    kubelet.release("ghost")

    first = await agent.check.check()
    second = await agent.check.check()

    assert [(f.kind, f.pod) for f in first] == [("unknown_to_log", "ns/early")]
    assert sorted((f.kind, f.pod) for f in second) == [
        ("missing_from_kubelet", "ns/ghost"),
        ("unknown_to_log", "ns/early"),
    ]
    assert agent.inspect()["pod_resources"]["findings"]


async def test_the_check_runs_after_allocate_when_asked_to(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target, replace(FAST, reconcile_after_allocate=True))
    await kubelet.wait_for_devices(RESOURCE)
    await book.bind(await book.reserve("p", [("c", GPU0, 256, False)]))
    await kubelet.admit(pod_spec("p", {"c": 256}))
    async with asyncio.timeout(10):
        await agent.check.wait_for_checks(1)
    assert agent.check.last_error is None


async def test_an_absent_kubelet_is_recorded_not_fatal(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent
) -> None:
    await Logbook(js).report(GPU0)
    agent = await start_agent(target)
    assert await agent.check.check() == ()
    assert agent.check.last_error is not None


async def test_a_container_the_kubelet_stops_listing_is_a_finding_only_after_the_grace(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    """A restarted kubelet lists its pods again only once it re-admitted them: until the
    grace has passed, a missing container is not reported."""
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target, replace(FAST, missing_grace_seconds=0.5))
    await kubelet.wait_for_devices(RESOURCE, lambda devices: len(devices) == 8192)
    await book.bind(await book.reserve("p", [("c", GPU1, 256, False)]))
    await kubelet.admit(pod_spec("p", {"c": 256}))
    kubelet.release("p")  # not listed any more (a kubelet busy re-admitting, say)

    assert await agent.check.check() == ()
    assert await agent.check.check() == ()  # two checks in a row, within the grace
    await asyncio.sleep(0.6)
    (finding,) = await agent.check.check()

    assert (finding.kind, finding.pod) == ("missing_from_kubelet", "ns/p")
