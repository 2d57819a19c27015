"""The same small scenario with the extender stanza's ``nodeCacheCapable`` true (what
``deploy/`` configures: kube-scheduler sends node names) and false (it sends whole Node
objects, and expects the nodes that pass back as objects).

A :class:`RecordingProxy` on the stanza's port keeps a copy of every call, so the tests see
what kube-scheduler really sent and what the allocator answered, besides where the pods
went and why one stays Pending.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpushare.cli.stack import Stack
from gpushare.core.annotations import IDX
from gpushare.core.requests import GPU_MEM
from gpushare.embedded.k8s_cluster import ControlPlane
from gpushare.embedded.k8s_extender import ExtenderStanza, extender_url
from tests.k8s.scheduling import (
    Call,
    RecordingProxy,
    annotations_of,
    gpu_pod,
    running_stack,
    wait_bound,
    wait_unschedulable,
)

NODES = ["cache-a=16276,16276", "cache-b=32510"]
NAMES = ["cache-a", "cache-b"]
TOO_BIG = "needs 17000 MiB of GPU memory on one card, more than any card here has in total"


@pytest.fixture
def recorded(
    request: pytest.FixtureRequest, k8s_clean: ControlPlane, extender_port: int, short_tmp: Path
) -> Iterator[tuple[Stack, RecordingProxy]]:
    """kube-scheduler with ``nodeCacheCapable`` as the test's parameter, calling the
    allocator through a recording proxy."""
    stanza = ExtenderStanza(extender_url(extender_port), node_cache_capable=request.param)
    k8s_clean.reconfigure_scheduler([stanza])
    with (
        running_stack(k8s_clean, short_tmp / "stack", NODES) as stack,
        RecordingProxy(extender_port, stack.allocator_ports["allocator"]) as proxy,
    ):
        yield stack, proxy


@pytest.mark.parametrize("recorded", [True, False], ids=["names", "nodes"], indirect=True)
def test_pods_schedule_alike_whether_the_scheduler_sends_node_names_or_nodes(
    recorded: tuple[Stack, RecordingProxy], k8s_api: client.CoreV1Api, k8s_clean: ControlPlane
) -> None:
    _, proxy = recorded
    node_cache = k8s_clean.extenders[0].node_cache_capable

    # 20000 MiB fit only cache-b's one large card, though both nodes have that much
    k8s_api.create_namespaced_pod("default", gpu_pod("big", 20000))
    big = wait_bound(k8s_api, "big")
    assert (big["spec"]["nodeName"], annotations_of(big)[IDX]) == ("cache-b", "0")
    k8s_api.create_namespaced_pod("default", gpu_pod("small", 4000))
    wait_bound(k8s_api, "small")
    # 17000 MiB: cache-b has too little left in all, cache-a's cards are too small
    k8s_api.create_namespaced_pod("default", gpu_pod("huge", 17000))
    message = wait_unschedulable(k8s_api, "huge")
    assert message.startswith("0/2 nodes are available:"), message
    assert f"1 Insufficient {GPU_MEM}" in message, message
    assert f"1 {TOO_BIG} (largest 16276 MiB)" in message, message

    first = proxy.of("filter")[0]
    assert first.request["Pod"]["metadata"]["name"] == "big"
    assert_filter_wire(first, node_cache)
    assert {call.status for call in proxy.calls} == {200}
    for call in proxy.of("filter"):
        assert_filter_wire(call, node_cache)
    for call in proxy.of("prioritize"):
        assert_args_wire(call.request, node_cache)
        assert {host["Host"] for host in call.answer} <= set(NAMES)
    binds = proxy.of("bind")
    assert sorted(call.request["PodName"] for call in binds) == ["big", "small"]
    assert all(call.answer == {"Error": ""} for call in binds)


def assert_args_wire(args: dict[str, object], node_cache: bool) -> None:
    """ExtenderArgs: node names with ``nodeCacheCapable``, else a NodeList of whole Nodes."""
    if node_cache:
        assert args["Nodes"] is None
        assert isinstance(args["NodeNames"], list)
        assert set(args["NodeNames"]) <= set(NAMES)
    else:
        assert args["NodeNames"] is None
        assert isinstance(args["Nodes"], dict)
        items = args["Nodes"]["items"]
        assert {item["metadata"]["name"] for item in items} <= set(NAMES)
        assert all(GPU_MEM in item["status"]["allocatable"] for item in items)


def assert_filter_wire(call: Call, node_cache: bool) -> None:
    """The request as :func:`assert_args_wire`; the nodes that pass answered in the same
    form, a reason for every other one, except the nodes that fit but lost to the one node
    filter chose (the allocator's default ``--choose-in-filter``), which are left out."""
    assert_args_wire(call.request, node_cache)
    asked = (
        call.request["NodeNames"]
        if node_cache
        else [item["metadata"]["name"] for item in call.request["Nodes"]["items"]]
    )
    answer = call.answer
    if node_cache:
        passed = answer["NodeNames"]
        assert answer["Nodes"] is None
    else:
        passed = [item["metadata"]["name"] for item in answer["Nodes"]["items"]]
        assert answer["NodeNames"] is None
    failed = {**answer["FailedNodes"], **(answer.get("FailedAndUnresolvableNodes") or {})}
    assert set(passed).isdisjoint(failed), answer
    assert {*passed, *failed} <= set(asked), answer
    left_out = set(asked) - {*passed, *failed}
    assert not left_out or len(passed) == 1, answer
    assert answer["Error"] == ""
    if call.request["Pod"]["metadata"]["name"] == "big":
        assert passed == ["cache-b"]
        assert failed["cache-a"].startswith("needs 20000 MiB of GPU memory on one card")
