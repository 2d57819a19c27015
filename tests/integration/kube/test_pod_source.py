"""The Kubernetes PodSource adapter reads a pod through KubeClient over HTTP (kmock's emulator)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import pytest
from kubernetes import client

from gpushare.core.requests import read_gpu_request
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from gpushare.kube.pod_source import UNSCHEDULED, KubernetesPodSource
from tests.contracts.kube_api import pod_informer, synced, until
from tests.unit.allocator.builders import gpu_pod


@pytest.fixture
async def core_api(kmock: Any) -> AsyncIterator[Any]:
    config = client.Configuration()
    config.host = str(kmock.url).rstrip("/")
    api_client = client.ApiClient(config)
    try:
        yield client.CoreV1Api(api_client)
    finally:
        await asyncio.to_thread(api_client.close)


async def test_reads_an_existing_pod_and_none_for_a_missing_one(core_api: Any) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", **gpu_pod("p", 1024, uid="uid-1")}
    await asyncio.to_thread(core_api.create_namespaced_pod, "default", pod)
    source = KubernetesPodSource(KubeClient(core_api.api_client))

    try:
        found = await source.read_pod("default", "p")
        assert found is not None
        assert found.metadata.uid == "uid-1"
        assert found.metadata.creation_timestamp is not None
        assert read_gpu_request(found).memory_mib == 1024
        assert await source.read_pod("default", "missing") is None
    finally:
        await source.stop()


async def test_the_informers_list_comes_in_pages(kube: KubeClient, kube_api: KubeApiServer) -> None:
    """Five pods in pages of two: three list requests, each decoded on its own."""
    for n in range(5):
        kube_api.create_pod(gpu_pod(f"p{n}", 1024, uid=f"uid-{n}"), "default")
    informer = pod_informer(kube, "/api/v1/pods", page=2)
    async with synced(informer):
        assert sorted(informer.items()) == [f"p{n}" for n in range(5)]
        lists = [r for r in kube_api.requests("GET", r"^/api/v1/pods") if "watch=" not in r.query]
        assert len(lists) == 3


async def test_a_quiet_watch_resumes_from_the_bookmark_it_was_sent(
    kube: KubeClient, kube_api: KubeApiServer
) -> None:
    """The unscheduled pods' watch, with every pod placed: the next round asks from the
    version the bookmark carried, not from the list's (which a busy API server's window
    of recent changes would have let go: 410 Gone, and a fresh list)."""

    def placed(name: str) -> dict[str, Any]:
        pod = gpu_pod(name, 1024, uid=f"uid-{name}")
        pod["spec"]["nodeName"] = "n1"
        return pod

    kube_api.create_pod(placed("first"), "default")
    informer = pod_informer(
        kube, "/api/v1/pods", page=10, field_selector=UNSCHEDULED, watch_seconds=1
    )
    async with synced(informer):
        listed = kube_api.store.revision
        for n in range(3):
            kube_api.create_pod(placed(f"p{n}"), "default")
        changed = kube_api.store.revision
        assert changed > listed

        def watches() -> list[str]:
            return [
                r.query for r in kube_api.requests("GET", r"^/api/v1/pods") if "watch=" in r.query
            ]

        await until(lambda: len(watches()) >= 2)
    first, second = (parse_qs(query) for query in watches()[:2])
    assert first["allowWatchBookmarks"] == ["true"]
    assert first["resourceVersion"] == [str(listed)]
    assert second["resourceVersion"] == [str(changed)]
    assert not informer.items()


async def test_an_informer_the_api_keeps_failing_lists_less_and_less_often(
    kube: KubeClient, kube_api: KubeApiServer
) -> None:
    """Each failure in a row doubles the wait before the next list: waits of 0.05 s
    that double are six lists in 1.6 s, where a constant wait made 30."""
    kube_api.fail_next("GET", r"^/api/v1/pods$", 503, "the API is overloaded", times=-1)
    informer = pod_informer(kube, "/api/v1/pods", page=10, retry_seconds=0.05)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.sleep(1.6)
        assert not informer.synced
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    lists = kube_api.requests("GET", r"^/api/v1/pods$", status=503)
    assert 3 <= len(lists) <= 7
