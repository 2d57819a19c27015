"""gpushare.kube against the stand-in: binding outcomes, patches, node status, watches."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from gpushare.core.annotations import RESERVATION
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.embedded.nats_server import free_port
from gpushare.kube.binding import bind_pod
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import (
    ConflictError,
    Expired,
    NotFound,
    PermanentError,
    TemporaryError,
    classify,
)
from gpushare.kube.nodes import node_exists, set_node_gpu_count
from gpushare.kube.pods import get_pod, list_pods, patch_pod_annotations
from gpushare.kube.watching import PodEvent, watch_pods
from tests.integration.kube.waiting import eventually

OURS = {RESERVATION: "reservation-1", "example.com/extra": "x"}


def pod_manifest(name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


async def bind(kube: KubeClient, uid: str, node: str = "n1", name: str = "p1") -> Any:
    return await bind_pod(kube, namespace="ns", name=name, uid=uid, node=node, annotations=OURS)


async def test_bind_writes_node_and_annotations(kube_api: KubeApiServer, kube: KubeClient) -> None:
    uid = kube_api.create_pod(pod_manifest("p1"), "ns")["metadata"]["uid"]
    outcome = await bind(kube, uid)
    assert (outcome.result, outcome.status) == ("bound", 201)
    pod = await get_pod(kube, "ns", "p1")
    assert pod is not None
    assert pod.spec.node_name == "n1"
    assert pod.annotations == OURS


async def test_a_repeated_bind_of_the_same_reservation_is_bound(
    kube_api: KubeApiServer, kube: KubeClient
) -> None:
    uid = kube_api.create_pod(pod_manifest("p1"), "ns")["metadata"]["uid"]
    assert (await bind(kube, uid)).bound
    again = await bind(kube, uid)
    assert (again.result, again.status) == ("bound", 409)
    assert len(kube_api.requests("POST", "/binding$", status=201)) == 1


async def test_bind_is_refused_elsewhere_gone_or_replaced(
    kube_api: KubeApiServer, kube: KubeClient
) -> None:
    uid = kube_api.create_pod(pod_manifest("p1", node="other"), "ns")["metadata"]["uid"]
    elsewhere = await bind(kube, uid)
    assert (elsewhere.result, elsewhere.status) == ("refused", 409)
    assert 'already assigned to node "other"' in elsewhere.message
    missing = await bind(kube, "uid-x", name="ghost")
    assert (missing.result, missing.status) == ("refused", 404)
    kube_api.create_pod(pod_manifest("p2"), "ns")
    replaced = await bind(kube, "an-older-uid", name="p2")
    assert replaced.result == "refused"
    assert "Precondition failed: UID" in replaced.message


async def test_injected_errors_map_to_refused_or_temporary(
    kube_api: KubeApiServer, kube: KubeClient
) -> None:
    uid = kube_api.create_pod(pod_manifest("p1"), "ns")["metadata"]["uid"]
    kube_api.fail_next("POST", "/binding$", 409, "the pod is held by someone else")
    conflict = await bind(kube, uid)
    assert (conflict.result, conflict.message) == ("refused", "the pod is held by someone else")
    kube_api.fail_next("POST", "/binding$", 500)
    assert (await bind(kube, uid)).result == "temporary"
    kube_api.fail_next("POST", "/binding$", 422, "spec.whatever: Invalid value")
    assert (await bind(kube, uid)).result == "refused"
    assert (await bind(kube, uid)).bound


async def test_an_unreachable_api_is_temporary(tmp_path: Path) -> None:
    server = KubeApiServer(port=free_port())
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")  # nothing listens there
    kube = KubeClient.connect(kubeconfig)
    kube.api_client.configuration.retries = 0
    try:
        outcome = await bind(kube, "uid")
        assert outcome.result == "temporary"
        with pytest.raises(TemporaryError):
            await list_pods(kube)
    finally:
        await kube.aclose()


async def test_patch_annotations_with_a_uid_precondition(
    kube_api: KubeApiServer, kube: KubeClient
) -> None:
    created = kube_api.create_pod(
        {**pod_manifest("p1"), "metadata": {"name": "p1", "annotations": {"a": "1", "b": "2"}}},
        "ns",
    )
    uid = created["metadata"]["uid"]
    await patch_pod_annotations(kube, "ns", "p1", {"b": None, "c": "3"}, uid=uid)
    pod = await get_pod(kube, "ns", "p1")
    assert pod is not None
    assert pod.annotations == {"a": "1", "c": "3"}
    with pytest.raises(ConflictError):
        await patch_pod_annotations(kube, "ns", "p1", {"d": "4"}, uid="someone-else")
    with pytest.raises(NotFound):
        await patch_pod_annotations(kube, "ns", "ghost", {"d": "4"})


async def test_node_gpu_count(kube_api: KubeApiServer, kube: KubeClient) -> None:
    kube_api.create_node("n1", capacity={"cpu": "4"})
    await set_node_gpu_count(kube, "n1", 3)
    node = kube_api.get("nodes", "n1")
    assert node is not None
    assert node["status"]["capacity"] == {"cpu": "4", "aliyun.com/gpu-count": "3"}
    assert node["status"]["allocatable"]["aliyun.com/gpu-count"] == "3"
    assert await node_exists(kube, "n1")
    assert not await node_exists(kube, "n2")
    with pytest.raises(NotFound):
        await set_node_gpu_count(kube, "n2", 1)


async def test_list_then_watch_pods(kube_api: KubeApiServer, kube: KubeClient) -> None:
    kube_api.create_pod(pod_manifest("p1"), "ns")
    pods = await list_pods(kube)
    assert [pod.metadata.name for pod in pods.items] == ["p1"]
    assert (await list_pods(kube, field_selector="spec.nodeName=n1")).items == ()
    events: list[PodEvent] = []
    stream = watch_pods(kube, pods.resource_version, timeout_seconds=1)
    async with contextlib.aclosing(stream):
        kube_api.create_pod(pod_manifest("p2"), "ns")
        kube_api.set_pod_phase("ns", "p1", "Succeeded")
        kube_api.delete("pods", "p2", "ns")
        async for event in stream:
            events.append(event)
            if len(events) == 3:
                break
    assert [(e.type, e.pod.metadata.name) for e in events] == [
        ("ADDED", "p2"),
        ("MODIFIED", "p1"),
        ("DELETED", "p2"),
    ]
    assert events[1].pod.phase == "Succeeded"


async def test_a_watch_is_renewed_after_server_side_timeouts(
    kube_api: KubeApiServer, kube: KubeClient
) -> None:
    pods = await list_pods(kube)
    stream = watch_pods(kube, pods.resource_version, timeout_seconds=1)

    async def first() -> PodEvent:
        return await anext(stream)

    async with contextlib.aclosing(stream):
        waiting = asyncio.create_task(first())
        # the list, then a watch, then its renewal after the server ended it
        await eventually(lambda: len(kube_api.requests("GET", "^/api/v1/pods$")) >= 3)
        kube_api.create_pod(pod_manifest("late"), "ns")
        event = await waiting
    assert (event.type, event.pod.metadata.name) == ("ADDED", "late")


async def test_an_expired_watch_raises(tmp_path: Path) -> None:
    async with KubeApiServer(history_size=1) as server:
        for name in ("a", "b", "c"):
            server.create_pod(pod_manifest(name))
        kube = KubeClient.connect(server.write_kubeconfig(tmp_path / "kubeconfig"))
        try:
            stream = watch_pods(kube, "1")
            async with contextlib.aclosing(stream):
                with pytest.raises(Expired):
                    await anext(stream)
        finally:
            await kube.aclose()


def test_classify_maps_status_codes_once() -> None:
    assert isinstance(classify(ApiException(status=503)), TemporaryError)
    assert isinstance(classify(ApiException(status=429)), TemporaryError)
    assert isinstance(classify(ApiException(status=409)), ConflictError)
    assert isinstance(classify(ApiException(status=404)), NotFound)
    assert isinstance(classify(ApiException(status=422)), PermanentError)
    assert isinstance(classify(ApiException(status=410)), Expired)
    assert isinstance(classify(MaxRetryError(None, "/", "refused")), TemporaryError)  # type: ignore[arg-type]
    assert classify(ValueError("a bug")) is None
    error = classify(ApiException(status=409, reason="Conflict"))
    assert error is not None
    assert error.message == "Conflict"
