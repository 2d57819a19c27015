"""The node agent and the test kubelet, end to end over unix sockets and JetStream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace

import grpc
import pytest
from nats.js import JetStreamContext

from gpushare.core.device_ids import expand_ids
from gpushare.embedded.kubelet import AdmissionError
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from gpushare.node_agent.agent import NodeAgent
from gpushare.node_agent.settings import NodeTarget
from tests.integration.kube.waiting import eventually
from tests.integration.node_agent.conftest import FAST, StartAgent, StartKubelet
from tests.integration.node_agent.logbook import (
    RESOURCE,
    Logbook,
    gpu,
    pod_spec,
    wait_until_assigned,
)
from tests.unit.node_agent.builders import at

GPU0, GPU1 = gpu(0), gpu(1)


def healthy_count(expected: int) -> Callable[[dict[str, str]], bool]:
    def ready(devices: dict[str, str]) -> bool:
        return sum(1 for h in devices.values() if h == "Healthy") == expected

    return ready


async def test_registers_and_lists_one_id_per_mib(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    await Logbook(js).report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    devices = await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))
    assert len(devices) == 8192
    assert {agent.view.table.card_of(d) for d in devices} == {GPU0, GPU1}
    endpoint = kubelet.endpoints[RESOURCE]
    assert endpoint.options.get_preferred_allocation_available
    assert endpoint.socket == target.plugin_socket


async def test_admitted_container_gets_the_logged_card_and_the_log_records_it(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))
    await book.bind(await book.reserve("p", [("c", GPU1, 1024, False)]))

    admitted = await kubelet.admit(pod_spec("p", {"c": 1024}))

    envs = admitted.envs("c")
    assert envs["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid
    assert envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == "1024"
    assert envs["ALIYUN_COM_GPU_MEM_IDX"] == "1"
    (entry,) = admitted.devices
    assert len(entry.device_ids) == 1024
    assert {agent.view.table.card_of(d) for d in entry.device_ids} == {GPU1}
    (assigned,) = await book.assignments()
    assert (assigned.pod.uid, assigned.container) == ("p", "c")
    assert assigned.card_uuids == (GPU1.uuid,)
    assert set(expand_ids(assigned.device_ids)) == set(entry.device_ids)
    assert len(assigned.device_ids) < 1024  # written as runs
    await wait_until_assigned(agent, "p", {"c"})
    assert agent.view.claimed == set()


async def test_two_same_size_pods_admitted_back_to_back_each_get_their_card(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))
    # binpack may well put the older pod on the second card
    await book.bind(await book.reserve("a", [("c", GPU1, 2048, False)], created=at(0)))
    await book.bind(await book.reserve("b", [("c", GPU0, 2048, False)], created=at(1)))

    first = await kubelet.admit(pod_spec("a", {"c": 2048}))
    second = await kubelet.admit(pod_spec("b", {"c": 2048}))

    assert first.envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid
    assert second.envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU0.uuid
    recorded = {event.pod.uid: event.card_uuids for event in await book.assignments()}
    assert recorded == {"a": (GPU1.uuid,), "b": (GPU0.uuid,)}


async def test_concurrent_admissions_on_two_kubelet_calls_never_share_a_container(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0)
    kubelet = await start_kubelet(target)
    await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(4096))
    for uid in ("x", "y", "z"):
        await book.bind(await book.reserve(uid, [("c", GPU0, 1024, False)]))

    # the kubelet admits one pod at a time; call the plugin directly to overlap calls
    endpoint = kubelet.endpoints[RESOURCE]
    ids = sorted(kubelet.devices(RESOURCE))
    chunks = [ids[n * 1024 : (n + 1) * 1024] for n in range(3)]
    requests = [
        dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=chunk)])
        for chunk in chunks
    ]
    await asyncio.gather(*(endpoint.stub.Allocate(r) for r in requests))
    assert sorted(e.pod.uid for e in await book.assignments()) == ["x", "y", "z"]


async def test_multi_container_pod_with_an_init_container(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))
    shares = [("setup", GPU1, 1024, True), ("app", GPU1, 1024, False), ("side", GPU1, 512, False)]
    await book.bind(await book.reserve("m", shares))

    admitted = await kubelet.admit(pod_spec("m", {"app": 1024, "side": 512}, init={"setup": 1024}))

    for container in ("setup", "app", "side"):
        assert admitted.envs(container)["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid
    by_container = {entry.container: set(entry.device_ids) for entry in admitted.devices}
    assert by_container["app"] == by_container["setup"]  # the kubelet reused the init's IDs
    assert admitted.envs("side")["ALIYUN_COM_GPU_MEM_CONTAINER"] == "512"
    assert admitted.envs("app")["ALIYUN_COM_GPU_MEM_POD"] == "1536"
    await wait_until_assigned(agent, "m", {"setup", "app", "side"})
    assert await agent.check.check() == ()


async def test_allocate_without_a_matching_pod_fails_with_a_readable_reason(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))
    await book.bind(await book.reserve("other", [("c", GPU0, 2048, False)]))

    with pytest.raises(AdmissionError) as caught:
        await kubelet.admit(pod_spec("stray", {"c": 1024}))

    message = caught.value.message
    assert caught.value.reason == "UnexpectedAdmissionError"
    assert message.startswith("Allocate failed due to rpc error: code = FailedPrecondition")
    assert "no bound pod on node n1 waits for 1024 MiB on GPU" in message
    assert "ns/other container 'c' (2048 MiB on GPU0" in message
    assert "stray" not in kubelet.pods
    assert await book.assignments() == []


async def test_allocate_waits_for_a_binding_the_log_has_not_shown_yet(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    await start_agent(target, replace(FAST, match_wait_seconds=30.0))
    await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))
    reservation = await book.reserve("late", [("c", GPU1, 1024, False)])

    admission = asyncio.create_task(kubelet.admit(pod_spec("late", {"c": 1024})))
    await book.bind(reservation)
    admitted = await admission

    assert admitted.envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid


async def test_an_unhealthy_card_is_listed_unhealthy(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))

    await book.report(GPU0, gpu(1, healthy=False))

    devices = await kubelet.wait_for_devices(RESOURCE, healthy_count(4096))
    assert {devices[d] for d in agent.view.table.ids_of(GPU1)} == {"Unhealthy"}
    assert {devices[d] for d in agent.view.table.ids_of(GPU0)} == {"Healthy"}


async def test_kubelet_restart_makes_the_plugin_register_again(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0)
    first = await start_kubelet(target)
    agent = await start_agent(target)
    await first.wait_for_devices(RESOURCE, healthy_count(4096))
    await first.wait_until(lambda: first.registrations == len(agent.endpoints))
    await eventually(lambda: {e.registrations for e in agent.endpoints.values()} == {1})
    await first.stop()

    second = await start_kubelet(target)  # deletes every socket in the directory
    await second.wait_for_devices(RESOURCE, healthy_count(4096))
    await book.bind(await book.reserve("p", [("c", GPU0, 512, False)]))
    admitted = await second.admit(pod_spec("p", {"c": 512}))

    # one registration per advertised resource, each again after the restart
    await second.wait_until(lambda: second.registrations == len(agent.endpoints))
    await eventually(lambda: {e.registrations for e in agent.endpoints.values()} == {2})
    assert target.plugin_socket.is_socket()
    assert all(endpoint.socket.is_socket() for endpoint in agent.endpoints.values())
    assert admitted.envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU0.uuid


async def test_gib_units_end_to_end(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    big0, big1 = gpu(0, mib=81920), gpu(1, mib=81920)
    await book.report(big0, big1)
    kubelet = await start_kubelet(target)
    await start_agent(target, replace(FAST, memory_unit="GiB"))
    await kubelet.wait_for_devices(RESOURCE, healthy_count(160))
    await book.bind(await book.reserve("g", [("c", big1, 3 * 1024, False)]))

    admitted = await kubelet.admit(pod_spec("g", {"c": 3}))

    assert admitted.envs("c")["NVIDIA_VISIBLE_DEVICES"] == big1.uuid
    assert admitted.envs("c")["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
    assert admitted.envs("c")["ALIYUN_COM_GPU_MEM_UNIT"] == "GiB"


async def test_an_inventory_too_large_for_the_kubelet_keeps_the_last_list(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(4096))
    version = agent.view.version

    await book.report(gpu(0, mib=81920), gpu(1, mib=81920))  # 163840 MiB IDs: over 4 MiB
    await agent.view.wait_changed(version, limit_seconds=10)

    problem = agent.inspect()["problem"]
    assert problem is not None
    assert "GPUSHARE_MEMORY_UNIT=GiB" in problem
    assert len(kubelet.devices(RESOURCE)) == 4096
    assert agent.view.table.count == 4096


async def test_pods_admitted_against_creation_order_each_get_their_own_card(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    """The kubelet's pod-resources names the pod being admitted: no guess by age."""
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))
    await book.bind(await book.reserve("old", [("c", GPU0, 2048, False)], created=at(0)))
    await book.bind(await book.reserve("new", [("c", GPU1, 2048, False)], created=at(5)))

    newer = await kubelet.admit(pod_spec("new", {"c": 2048}))
    older = await kubelet.admit(pod_spec("old", {"c": 2048}))

    assert newer.envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid
    assert older.envs("c")["NVIDIA_VISIBLE_DEVICES"] == GPU0.uuid
    recorded = {event.pod.uid: event.card_uuids for event in await book.assignments()}
    assert recorded == {"new": (GPU1.uuid,), "old": (GPU0.uuid,)}
    findings = await agent.check.check()
    assert findings == ()


async def test_preferred_allocation_answers_exactly_the_size_asked(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0, GPU1)
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, healthy_count(8192))
    await book.bind(await book.reserve("p", [("c", GPU1, 1024, False)]))
    table = agent.view.table
    on0, on1 = list(table.ids_of(GPU0)), list(table.ids_of(GPU1))
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=on0[1:] + on1,
                must_include_deviceIDs=on0[:1],
                allocation_size=2,
            )
        ]
    )

    response = await kubelet.endpoints[RESOURCE].stub.GetPreferredAllocation(request)

    (answer,) = response.container_responses
    assert len(answer.deviceIDs) == 2
    assert on0[0] in answer.deviceIDs


async def test_allocate_with_ids_never_advertised_is_refused_at_once(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(GPU0)
    kubelet = await start_kubelet(target)
    await start_agent(target, replace(FAST, match_wait_seconds=30.0))
    await kubelet.wait_for_devices(RESOURCE, healthy_count(4096))
    request = dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=["nope-1", "nope-2"])]
    )
    loop = asyncio.get_running_loop()
    started = loop.time()

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.endpoints[RESOURCE].stub.Allocate(request)

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "nope-1" in str(refused.value.details())
    assert loop.time() - started < 30.0


async def test_the_agent_serves_only_while_registered_with_the_kubelet_that_runs(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    """What the binder's readiness question reads: false from the moment a restarted
    kubelet deleted our sockets until every resource is registered and listed again."""
    book = Logbook(js)
    await book.report(GPU0)
    first = await start_kubelet(target)
    agent = await start_agent(target, replace(FAST, registration_poll_seconds=5.0))
    await first.wait_for_devices(RESOURCE, healthy_count(4096))
    await eventually(agent.serving)
    await first.stop()

    await start_kubelet(target)  # deletes our sockets, a new kubelet.sock

    assert not agent.serving()  # at once, not at the endpoint's next poll (5 s away)
    await eventually(agent.serving, within=20.0)


async def test_the_agent_serves_only_once_the_kubelet_has_taken_its_device_list(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    """A busy kubelet takes a while to process the list it was sent; until it has, it
    refuses every pod needing the resource, so the agent is not serving yet."""
    await Logbook(js).report(GPU0)
    kubelet = await start_kubelet(target)
    kubelet.list_lag_seconds = 1.5
    agent = await start_agent(target)
    await eventually(lambda: agent.services[RESOURCE].watching > 0)

    assert not agent.serving()
    assert not kubelet.endpoints[RESOURCE].healthy()  # sent, not taken yet
    await eventually(agent.serving, within=10.0)
    assert len(kubelet.endpoints[RESOURCE].healthy()) == 4096


async def test_a_crashed_agent_loop_is_logged_and_run_again(
    js: JetStreamContext,
    target: NodeTarget,
    start_kubelet: StartKubelet,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Asking the kubelet whether it took the device list fails once with a bug of ours:
    the loop that asks is restarted, so the agent still comes to serve (it never would
    if that loop had died)."""
    await Logbook(js).report(GPU0)
    await start_kubelet(target)
    agent = NodeAgent(js, target, FAST)
    asks = 0
    ask = agent.lists.ask

    async def fails_once(waiting: Mapping[str, int]) -> None:
        nonlocal asks
        asks += 1
        if asks == 1:
            raise RuntimeError("a bug")
        await ask(waiting)

    agent.lists.ask = fails_once  # type: ignore[method-assign]
    await agent.start()
    try:
        await eventually(agent.serving, within=10.0)
    finally:
        await agent.stop()
    crashes = [r.getMessage() for r in caplog.records if "crashed" in r.getMessage()]
    assert crashes == [f"node {target.name}: kubelet lists crashed; restarting it"]
