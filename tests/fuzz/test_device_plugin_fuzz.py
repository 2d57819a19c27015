"""Fuzzing the node agent's device plugin over its real unix sockets (real nats-server, the
test kubelet registered and watching).

The kubelet is the only client a device plugin has, and it only ever sends IDs it was
given; but the socket is a file any process on the node can open. So Allocate and
GetPreferredAllocation get what the kubelet never sends: IDs never advertised, IDs of
another resource or of nothing, duplicates, empty requests, thousands of containers,
sizes negative and at int32's ends. Properties: every call is answered with a response
that keeps the kubelet's contract (advice only among the IDs offered, every
``must_include`` one in it) or with a gRPC error naming why, never an unhandled exception
(``UNKNOWN``) or a hang; and afterwards the plugin still serves: its device lists are
unchanged and a pod the log placed is admitted with its card.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.bus.connection import connect
from gpushare.bus.streams import ensure_streams
from gpushare.embedded.kubelet import EmbeddedKubelet
from gpushare.embedded.nats_server import NatsServer
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpushare.node_agent.agent import NodeAgent
from gpushare.node_agent.settings import NodeTarget
from tests.integration.node_agent.conftest import FAST
from tests.integration.node_agent.logbook import RESOURCE, Logbook, gpu, pod_spec

pytestmark = pytest.mark.asyncio(loop_scope="module")

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
CALL_TIMEOUT_S = 10.0
"""Far above what any call should take (the agent waits 0.05 s for the log here): a call
that runs into it is a hang, and a finding."""
PER_CONTAINER_S = 0.25
"""GetPreferredAllocation advises container after container, each after asking the
kubelet's pod-resources and the log and waiting out ``match_wait_seconds`` when the log
names no container: about 55 ms each here (found here: 300 containers took over 10 s;
with the default 5 s wait, minutes). The kubelet asks one container per call, so this is
slack, not a hang: the timeout grows by this much per container asked."""
INT32 = 2**31
ANSWERS = frozenset(
    {
        grpc.StatusCode.FAILED_PRECONDITION,  # the plugin's refusal, with the reason
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # over gRPC's message size limit
    }
)
"""Errors that answer a call: not UNKNOWN (an exception escaped the servicer), INTERNAL,
DEADLINE_EXCEEDED (a hang) or UNAVAILABLE (the server went away)."""
CARDS = (gpu(0), gpu(1))


@dataclass(frozen=True)
class Plugin:
    """The agent serving, the kubelet it registered with, and how to reach each socket."""

    agent: NodeAgent
    kubelet: EmbeddedKubelet
    book: Logbook
    sockets: dict[str, Path]
    devices: dict[str, tuple[str, ...]]
    """Each resource's advertised device IDs, as the kubelet got them."""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def plugin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Plugin]:
    server = NatsServer(Path(tmp_path_factory.mktemp("fuzz-plugin-jetstream"))).start()
    directory = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))  # unix paths stay short
    try:
        nc = await connect(server.url, name="fuzz-plugin")
        js = nc.jetstream()
        await ensure_streams(js)
        book = Logbook(js)
        await book.report(*CARDS)
        target = NodeTarget(name="n1", plugin_dir=directory / "device-plugins")
        kubelet = await EmbeddedKubelet(target.name, target.plugin_dir, seed=0).start()
        agent = NodeAgent(js, target, replace(FAST, match_wait_seconds=0.05))
        await agent.start()
        try:
            resources = agent.settings.resources
            for resource in resources:
                await kubelet.wait_for_devices(resource, bool)
            yield Plugin(
                agent=agent,
                kubelet=kubelet,
                book=book,
                sockets={resource: target.socket_of(resource) for resource in resources},
                devices={r: tuple(sorted(kubelet.devices(r))) for r in resources},
            )
        finally:
            await agent.stop()
            await kubelet.stop()
            await nc.close()
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def fuzz(plugin: Plugin, examples: Callable[[dict[str, Any]], None]) -> None:
    """Run ``examples`` (given a stub per resource) in a thread, with blocking gRPC
    channels on the plugin's sockets, while the event loop serves them."""

    def run() -> None:
        channels = {
            r: grpc.insecure_channel(f"unix://{path}") for r, path in plugin.sockets.items()
        }
        try:
            stubs = {r: dp_grpc.DevicePluginStub(channel) for r, channel in channels.items()}
            examples(stubs)
        finally:
            for channel in channels.values():
                channel.close()

    await asyncio.to_thread(run)


def answered(call: Callable[[], Any]) -> Any | None:
    """The call's response, or ``None`` when it was refused with an acceptable error."""
    refused: grpc.RpcError | None = None
    try:
        return call()
    except grpc.RpcError as error:
        refused = error
    code, details = refused.code(), refused.details()
    assert code in ANSWERS, (code, details)
    assert details, code
    return None


@st.composite
def device_ids(draw: st.DrawFn, plugin: Plugin, resource: str) -> list[str]:
    """IDs as the kubelet sends them, and as it never would."""
    own = plugin.devices[resource]
    others = [d for r, ids in plugin.devices.items() if r != resource for d in ids[:50]]
    one = st.one_of(
        st.sampled_from(own),
        st.sampled_from(own),
        st.sampled_from(others or own),
        st.text(max_size=16),
        st.sampled_from(["", " ", "\x00", "🎮" * 20, "x" * 10_000, own[0] + "0", own[0].upper()]),
    )
    shape = draw(st.sampled_from(["few", "many", "one-card", "all", "duplicates", "empty"]))
    if shape == "empty":
        return []
    if shape == "all":
        return list(own)
    if shape == "one-card":
        start = draw(st.integers(0, len(own) - 1))
        return list(own[start : start + draw(st.integers(1, 2048))])
    if shape == "duplicates":
        return [draw(st.sampled_from(own))] * draw(st.integers(2, 500))
    return draw(st.lists(one, max_size=200 if shape == "many" else 5))


sizes = st.one_of(
    st.integers(-5, 2100),
    st.sampled_from([0, -1, INT32 - 1, -INT32, 1, 1024, 4096, 8192, 8193]),
)
"""``allocation_size`` is an int32: negative, zero, one card, every ID, its ends."""
resources_of = st.sampled_from


def check_preferred(request: dp.PreferredAllocationRequest, response: Any) -> None:
    """One answer per container; each distinct, within what was offered, with every
    ``must_include`` ID, and no longer than asked (or than ``must_include`` itself)."""
    assert len(response.container_responses) == len(request.container_requests)
    for asked, advice in zip(request.container_requests, response.container_responses, strict=True):
        chosen = list(advice.deviceIDs)
        must = set(asked.must_include_deviceIDs)
        assert len(chosen) == len(set(chosen)), "an ID advised twice"
        assert set(chosen) <= set(asked.available_deviceIDs) | must, "an ID not offered"
        assert must <= set(chosen), "a must_include ID left out"
        assert len(chosen) <= max(asked.allocation_size, len(must))


async def test_odd_preferred_allocation_requests_are_answered(plugin: Plugin) -> None:
    @settings(FUZZ, max_examples=60)
    @given(data=st.data(), resource=resources_of(sorted(plugin.sockets)))
    def examples(stubs: dict[str, Any], data: st.DataObject, resource: str) -> None:
        containers = data.draw(st.integers(0, 3) | st.sampled_from([0, 12]))
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=data.draw(device_ids(plugin, resource)),
                    must_include_deviceIDs=data.draw(device_ids(plugin, resource))[:8],
                    allocation_size=data.draw(sizes),
                )
                for _ in range(containers)
            ]
        )
        stub = stubs[resource]
        timeout = CALL_TIMEOUT_S + PER_CONTAINER_S * containers
        response = answered(lambda: stub.GetPreferredAllocation(request, timeout=timeout))
        if response is not None:
            check_preferred(request, response)

    await fuzz(plugin, examples)
    await still_serving(plugin)


async def test_odd_allocate_requests_are_answered_or_refused(plugin: Plugin) -> None:
    """Nothing is reserved on the node: every Allocate is refused (the log explains none of
    them), with the reason, and nothing is claimed."""

    @FUZZ
    @given(data=st.data(), resource=resources_of(sorted(plugin.sockets)))
    def examples(stubs: dict[str, Any], data: st.DataObject, resource: str) -> None:
        containers = data.draw(st.integers(0, 4) | st.sampled_from([0, 64, 500]))
        request = dp.AllocateRequest(
            container_requests=[
                dp.ContainerAllocateRequest(devices_ids=data.draw(device_ids(plugin, resource)))
                for _ in range(containers)
            ]
        )
        stub = stubs[resource]
        response = answered(lambda: stub.Allocate(request, timeout=CALL_TIMEOUT_S))
        if response is not None:  # only an empty request has nothing to refuse
            assert not request.container_requests, response
            assert list(response.container_responses) == []

    await fuzz(plugin, examples)
    assert plugin.agent.view.claimed == set()
    await still_serving(plugin)


async def test_oversized_messages_are_refused_by_grpc(plugin: Plugin) -> None:
    """Past the server's 16 MiB receive limit: RESOURCE_EXHAUSTED, and the plugin lives."""

    def examples(stubs: dict[str, Any]) -> None:
        ids = ["x" * 1000] * 20_000  # 20 MB of IDs
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
        )
        with pytest.raises(grpc.RpcError) as caught:
            stubs[RESOURCE].Allocate(request, timeout=CALL_TIMEOUT_S)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    await fuzz(plugin, examples)
    await still_serving(plugin)


_AFTER = itertools.count(1)
"""Each check's pod has its own uid."""


async def still_serving(plugin: Plugin) -> None:
    """The same device lists, the options, and a pod the log placed admitted on its card."""
    for resource, ids in plugin.devices.items():
        assert tuple(sorted(plugin.kubelet.devices(resource))) == ids, resource
    endpoint = plugin.kubelet.endpoints[RESOURCE]
    options = await endpoint.stub.GetDevicePluginOptions(dp.Empty(), timeout=CALL_TIMEOUT_S)
    assert options.get_preferred_allocation_available
    uid = f"after-{next(_AFTER)}"
    book = plugin.book
    await book.bind(await book.reserve(uid, [("c", CARDS[1], 1024, False)]))
    admitted = await plugin.kubelet.admit(pod_spec(uid, {"c": 1024}))
    assert admitted.envs("c")["NVIDIA_VISIBLE_DEVICES"] == CARDS[1].uuid
    assert plugin.kubelet.release(uid)
