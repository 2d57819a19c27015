"""The test kubelet's pod watch and status patches, against the Kubernetes API stand-in
(which refuses another uid as kube-apiserver does: ``tests/contracts/kube_api.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client, config

from gpushare.embedded.kubelet import EmbeddedKubelet, PodWatcher
from gpushare.kube.client import KubeClient
from gpushare.kube.pods import get_pod
from tests.integration.kube.waiting import eventually

NAMESPACE = "default"


def manifest(name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
async def watcher(kubeconfig: Path, short_dir: Path) -> AsyncIterator[PodWatcher]:
    kubelet = await EmbeddedKubelet("n1", short_dir / "device-plugins").start()
    api_client = await config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield PodWatcher(kubelet, api_client)
    finally:
        await api_client.close()  # type: ignore[no-untyped-call]
        await kubelet.stop()


async def test_a_late_status_of_a_deleted_pod_never_lands_on_its_same_named_successor(
    watcher: PodWatcher, kube: KubeClient
) -> None:
    """The pod was bound here and deleted, and a pod of the same name created (not
    scheduled yet) before the kubelet got to the first: marking the first Running must
    not mark the second, which would then never be scheduled (bench-kube's lost pod)."""
    api = client.CoreV1Api(watcher.api.api_client)
    first = await api.create_namespaced_pod(NAMESPACE, manifest("again", node="n1"))
    seen = watcher.api.api_client.sanitize_for_serialization(first)
    await api.delete_namespaced_pod("again", NAMESPACE, grace_period_seconds=0)
    second = await api.create_namespaced_pod(NAMESPACE, manifest("again"))

    await watcher.handle("ADDED", seen)  # admitted (it asks no device), then its status

    assert first.metadata.uid in watcher.kubelet.pods
    pod = await get_pod(kube, NAMESPACE, "again")
    assert pod is not None
    assert (pod.metadata.uid, pod.phase, pod.spec.node_name) == (
        second.metadata.uid,
        "Pending",
        None,
    )


async def test_a_pod_of_its_own_is_marked_running(watcher: PodWatcher, kube: KubeClient) -> None:
    api = client.CoreV1Api(watcher.api.api_client)
    created = await api.create_namespaced_pod(NAMESPACE, manifest("mine", node="n1"))

    await watcher.handle("ADDED", watcher.api.api_client.sanitize_for_serialization(created))

    pod = await get_pod(kube, NAMESPACE, "mine")
    assert pod is not None
    assert pod.phase == "Running"


async def test_a_pod_deleted_while_no_watch_ran_is_released_by_the_next_list(
    watcher: PodWatcher,
) -> None:
    """No ``DELETED`` event ever comes for it; held for ever, it kept its devices and the
    node agent reported them unknown to the log (bench-kube's runs then never ended)."""
    api = client.CoreV1Api(watcher.api.api_client)
    created = await api.create_namespaced_pod(NAMESPACE, manifest("brief", node="n1"))
    uid = created.metadata.uid
    stop = asyncio.Event()
    watching = asyncio.create_task(watcher.run(stop))
    await eventually(lambda: uid in watcher.kubelet.pods)
    stop.set()
    await watching

    await api.delete_namespaced_pod("brief", NAMESPACE, grace_period_seconds=0)
    stop = asyncio.Event()
    watching = asyncio.create_task(watcher.run(stop))
    try:
        await eventually(lambda: uid not in watcher.kubelet.pods)
    finally:
        stop.set()
        await watching
