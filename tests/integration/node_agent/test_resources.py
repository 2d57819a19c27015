"""Several resources, one plugin socket each: every dialect admitted by the test kubelet."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nats.js import JetStreamContext

from gpushare.core.model import Card, ContainerShare
from gpushare.core.plugin_resources import DEFAULT_DIALECTS
from gpushare.core.pods import Pod, pod_from_dict
from gpushare.node_agent.agent import NodeAgent
from gpushare.node_agent.settings import AgentSettings, NodeTarget
from tests.integration.node_agent.conftest import FAST, StartAgent, StartKubelet
from tests.integration.node_agent.logbook import (
    RESOURCE,
    Logbook,
    gpu,
    pod_spec,
    wait_until_assigned,
)

GPU0, GPU1 = gpu(0), gpu(1)
CORE = "gpushare.io/gpu-core"
RATIO = "gpushare.io/gpu-memory-ratio"
MGPU_CORE = "vke.volcengine.com/mgpu-core"
MGPU_MEMORY = "vke.volcengine.com/mgpu-memory"


def share(container: str, card: Card, mib: int, core: int = 0) -> ContainerShare:
    return ContainerShare(
        container=container,
        card_index=card.index,
        card_uuid=card.uuid,
        memory_mib=mib,
        core_percent=core,
    )


def pod_asking(uid: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> Pod:
    manifest: dict[str, Any] = {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": annotations},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    return pod_from_dict(manifest)


async def started(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    start_kubelet: StartKubelet,
    *,
    dialects: tuple[str, ...] = DEFAULT_DIALECTS,
    mps: bool = False,
) -> tuple[Logbook, NodeAgent, Any]:
    book = Logbook(js)
    await book.report(GPU0, GPU1, mps=mps)
    kubelet = await start_kubelet(target)
    settings: AgentSettings = replace(FAST, dialects=dialects)
    agent = await start_agent(target, settings)
    for resource, table in agent.view.tables.items():
        await kubelet.wait_for_devices(resource, lambda d, n=table.count: len(d) == n)
    return book, agent, kubelet


async def test_every_default_resource_is_registered_with_its_count(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    _, agent, kubelet = await started(js, target, start_agent, start_kubelet)
    counts = {resource: len(kubelet.devices(resource)) for resource in agent.view.resources}
    assert counts == {RESOURCE: 8192, RATIO: 200, "gpushare.io/gpu": 200, CORE: 200}
    sockets = {kubelet.endpoints[r].socket.name for r in counts}
    assert len(sockets) == 4
    assert all(kubelet.endpoints[r].options.get_preferred_allocation_available for r in counts)


async def test_a_core_and_ratio_pod_is_handed_its_card_once(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, agent, kubelet = await started(js, target, start_agent, start_kubelet)
    reserved = await book.reserve_shares("p", share("c", GPU1, 2048, core=50))
    await book.bind(reserved, {"c": (CORE, RATIO)})

    admitted = await kubelet.admit(pod_asking("p", {CORE: "50", RATIO: "50"}))

    envs = admitted.envs("c")
    assert envs["NVIDIA_VISIBLE_DEVICES"] == GPU1.uuid
    assert envs["GPUSHARE_MEMORY_LIMIT_MIB"] == "2048"
    assert envs["GPUSHARE_CORE_PERCENT"] == "50"
    assert not [key for key in envs if key.startswith(("ALIYUN_COM", "CUDA_MPS"))]
    by_resource = {entry.resource: entry for entry in admitted.devices}
    assert by_resource[CORE].envs == {}  # counted only
    assert {agent.view.tables[RATIO].card_of(d) for d in by_resource[RATIO].device_ids} == {GPU1}
    assert {agent.view.tables[CORE].card_of(d) for d in by_resource[CORE].device_ids} == {GPU1}
    (assigned,) = await book.assignments()
    assert assigned.card_uuids == (GPU1.uuid,)
    await wait_until_assigned(agent, "p", {"c"})
    assert await agent.check.check() == ()


async def test_an_aliyun_pod_on_an_mps_node_gets_mps_limits(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, _, kubelet = await started(js, target, start_agent, start_kubelet, mps=True)
    reserved = await book.reserve("p", [("c", GPU0, 1024, False)])
    await book.bind(reserved, {"c": (RESOURCE,)})

    envs = (await kubelet.admit(pod_spec("p", {"c": 1024}))).envs("c")

    assert envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == "1024"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU0.uuid}=1024M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in envs


async def test_a_vke_container_on_two_cards_gets_both(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, agent, kubelet = await started(
        js, target, start_agent, start_kubelet, dialects=("aliyun", "vke"), mps=True
    )
    reserved = await book.reserve_shares(
        "v", share("c", GPU1, 1000, core=50), share("c", GPU0, 1000, core=50)
    )
    await book.bind(reserved, {"c": (MGPU_CORE, MGPU_MEMORY)})
    pod = pod_asking(
        "v",
        {MGPU_CORE: "100", MGPU_MEMORY: "2000"},
        {"vke.volcengine.com/container-multiple-gpu": "2"},
    )

    admitted = await kubelet.admit(pod)

    envs = admitted.envs("c")
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU1.uuid},{GPU0.uuid}"
    assert envs["GPUSHARE_VISIBLE_INDICES"] == "1,0"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU1.uuid}=1000M,{GPU0.uuid}=1000M"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    memory = next(entry for entry in admitted.devices if entry.resource == MGPU_MEMORY)
    per_card: dict[str, int] = {}
    for device in memory.device_ids:
        found = agent.view.tables[MGPU_MEMORY].card_of(device)
        assert found is not None
        per_card[found.uuid] = per_card.get(found.uuid, 0) + 1
    assert per_card == {GPU0.uuid: 1000, GPU1.uuid: 1000}
    (assigned,) = await book.assignments()
    assert assigned.card_uuids == (GPU1.uuid, GPU0.uuid)


async def test_whole_cards_through_nvidia_gpu(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book, _, kubelet = await started(
        js, target, start_agent, start_kubelet, dialects=("nvidia",), mps=True
    )
    whole = [share("c", card, card.memory_mib, core=100) for card in (GPU0, GPU1)]
    reserved = await book.reserve_shares("w", *whole)
    await book.bind(reserved, {"c": ("nvidia.com/gpu",)})

    envs = (await kubelet.admit(pod_asking("w", {"nvidia.com/gpu": "2"}))).envs("c")

    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{GPU0.uuid},{GPU1.uuid}",
        "GPUSHARE_VISIBLE_INDICES": "0,1",
    }
