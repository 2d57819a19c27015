"""The Kubernetes PodSource adapter reads a pod through KubeClient over HTTP (kmock's emulator)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client

from gpushare.core.requests import read_gpu_request
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from gpushare.kube.pod_source import KubernetesPodSource
from tests.contracts.kube_api import pod_informer, synced
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
