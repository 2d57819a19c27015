"""extender/v1 on the wire: the bodies a real kube-scheduler sent, decoded and re-encoded."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import msgspec
import pytest

from gpushare.allocator.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
    NodeList,
    WireError,
    decode,
    decode_host_priorities,
    encode,
    node_name,
)
from gpushare.core.pods import Pod
from tests.unit.allocator.builders import fixture, fixture_names

ARGS_FILES = [name for name in fixture_names(".request.json") if not name.startswith("bind")]
BIND_FILES = [name for name in fixture_names(".request.json") if name.startswith("bind")]


def lowercase_keys(document: dict[str, Any]) -> dict[str, Any]:
    """What an old extender client (or Go's case-insensitive decoder) would also accept."""
    return {key.lower(): value for key, value in document.items()}


def test_every_sample_is_covered() -> None:
    assert len(ARGS_FILES) == 4
    assert len(BIND_FILES) == 2
    assert len(fixture_names(".accepted-response.json")) == 6


@pytest.mark.parametrize("name", ARGS_FILES)
def test_extender_args_keep_every_key_and_node(name: str) -> None:
    body = fixture(name)
    sent = json.loads(body)
    args = decode(body, ExtenderArgs)
    again = json.loads(encode(args))

    assert list(again) == ["Pod", "Nodes", "NodeNames"]
    assert again["NodeNames"] == sent["NodeNames"]
    assert again["Nodes"] == sent["Nodes"]  # null stays null; a NodeList comes back whole
    if args.nodes is not None:
        # Raw items: a node that passes filter goes back exactly as kube-scheduler sent it.
        assert [bytes(item) for item in args.nodes.items] == [
            json.dumps(item, separators=(",", ":")).encode() for item in sent["Nodes"]["items"]
        ]


@pytest.mark.parametrize("name", ARGS_FILES)
def test_the_pod_keeps_what_gpushare_reads(name: str) -> None:
    sent = json.loads(fixture(name))["Pod"]
    pod = decode(fixture(name), ExtenderArgs).pod
    assert isinstance(pod, Pod)
    assert pod.metadata.name == sent["metadata"]["name"]
    assert pod.metadata.namespace == sent["metadata"]["namespace"]
    assert pod.metadata.uid == sent["metadata"]["uid"]
    created = datetime.fromisoformat(sent["metadata"]["creationTimestamp"])
    assert pod.metadata.creation_timestamp == created
    container = pod.spec.containers[0]
    assert container.name == "main"
    assert container.resources is not None
    assert container.resources.limits == {"aliyun.com/gpu-mem": "1024"}
    assert container.resources.requests == {"aliyun.com/gpu-mem": "1024"}
    # Re-encoded, the pod is the same object as far as gpushare's Pod type goes.
    assert msgspec.json.decode(encode(pod), type=Pod) == pod


@pytest.mark.parametrize("name", ARGS_FILES)
def test_extender_args_accept_lowercase_keys(name: str) -> None:
    legacy = json.dumps(lowercase_keys(json.loads(fixture(name))), separators=(",", ":"))
    assert decode(legacy.encode(), ExtenderArgs) == decode(fixture(name), ExtenderArgs)


@pytest.mark.parametrize("name", BIND_FILES)
def test_binding_args_round_trip(name: str) -> None:
    body = fixture(name)
    args = decode(body, ExtenderBindingArgs)
    assert args.pod_name == "gpu-pod-1"
    assert args.pod_namespace == "default"
    assert args.node.startswith("gpu-node-")
    assert json.loads(encode(args)) == json.loads(body)
    assert list(json.loads(encode(args))) == ["PodName", "PodNamespace", "PodUID", "Node"]
    legacy = json.dumps(lowercase_keys(json.loads(body))).encode()
    assert decode(legacy, ExtenderBindingArgs) == args


@pytest.mark.parametrize(
    "name", ["filter.accepted-response.json", "filter.nodecache.accepted-response.json"]
)
def test_accepted_filter_responses_decode(name: str) -> None:
    result = decode(fixture(name), ExtenderFilterResult)
    sent = json.loads(fixture(name))
    assert result.failed_nodes == {}
    assert result.error == ""
    if result.node_names is not None:
        assert result.node_names == sent["NodeNames"]
        assert result.nodes is None
    else:
        assert result.nodes is not None
        assert [node_name(item) for item in result.nodes.items] == ["gpu-node-1", "gpu-node-2"]
        assert json.loads(encode(result.nodes)) == sent["Nodes"]


@pytest.mark.parametrize(
    "name", ["prioritize.accepted-response.json", "prioritize.nodecache.accepted-response.json"]
)
def test_accepted_prioritize_responses_decode(name: str) -> None:
    priorities = decode_host_priorities(fixture(name))
    assert priorities == [
        HostPriority(host="gpu-node-1", score=0),
        HostPriority(host="gpu-node-2", score=0),
    ]
    assert json.loads(encode(priorities)) == json.loads(fixture(name))


@pytest.mark.parametrize(
    "name", ["bind.accepted-response.json", "bind.nodecache.accepted-response.json"]
)
def test_accepted_bind_responses_decode(name: str) -> None:
    assert decode(fixture(name), ExtenderBindingResult) == ExtenderBindingResult(error="")
    assert json.loads(encode(ExtenderBindingResult())) == json.loads(fixture(name))


def test_filter_result_never_omits_a_field() -> None:
    assert json.loads(encode(ExtenderFilterResult())) == {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    empty = json.loads(encode(ExtenderFilterResult(node_names=[])))
    assert empty["NodeNames"] == []  # empty (every node filtered) is not null


def test_host_priority_list_is_a_bare_array() -> None:
    assert encode([HostPriority(host="n1", score=7)]) == b'[{"Host":"n1","Score":7}]'
    legacy = decode_host_priorities(b'[{"host": "n1", "score": 7}]')
    assert legacy == [HostPriority(host="n1", score=7)]


def test_node_list_always_writes_metadata_and_items() -> None:
    plain = NodeList(items=[msgspec.Raw(b'{"metadata":{"name":"a"}}')])
    assert encode(plain) == b'{"metadata":{},"items":[{"metadata":{"name":"a"}}]}'
    assert encode(NodeList()) == b'{"metadata":{},"items":[]}'
    typed = decode(b'{"apiVersion":"v1","kind":"NodeList","metadata":{},"items":[]}', NodeList)
    assert typed == NodeList()


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[]",
        b"null",
        b'"Pod"',
        b'{"Pod": 3}',
        b'{"Pod": {"metadata": []}}',
        b'{"Pod": {}, "NodeNames": "n1"}',
        b'{"Pod": {}, "NodeNames": [1, 2]}',
        b'{"Pod": {}, "Nodes": {"items": 7}}',
        b'{"Pod": {"spec": {"containers": [{"resources": {}}]}}}',
        b"\xff\xfe",
    ],
)
def test_malformed_extender_args_are_wire_errors(body: bytes) -> None:
    with pytest.raises(WireError):
        decode(body, ExtenderArgs)


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b'{"PodName": "p"}',
        b'{"PodName": 1, "PodNamespace": "n", "PodUID": "u", "Node": "x"}',
    ],
)
def test_malformed_binding_args_are_wire_errors(body: bytes) -> None:
    with pytest.raises(WireError):
        decode(body, ExtenderBindingArgs)


def test_a_node_without_a_name_is_a_wire_error() -> None:
    with pytest.raises(WireError, match=r"metadata\.name"):
        node_name(msgspec.Raw(b'{"metadata": {}}'))
