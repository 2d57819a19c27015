"""bench-kube's binding watch: it notes each pod once, when it first shows a node."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kubernetes import client, config

from benchmarks.kube_scheduler import NAMESPACE, BindingWatch, pod
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.binding import bind_pod
from gpushare.kube.client import KubeClient


async def test_every_pod_is_noted_once_bound_and_the_watch_then_ends(
    kube_api: KubeApiServer, kubeconfig: Path, kube: KubeClient
) -> None:
    uids = {
        name: kube_api.create_pod(pod(name, 1000), NAMESPACE)["metadata"]["uid"]
        for name in ("bench-0", "bench-1", "bench-2")
    }
    other = pod("other", 1000)
    del other["metadata"]["labels"]
    other["spec"]["nodeName"] = "n1"
    kube_api.create_pod(other, NAMESPACE)
    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    watching = await asyncio.to_thread(BindingWatch(api, len(uids)).start)
    for name, uid in uids.items():
        assert not watching.done.is_set()
        bound = await bind_pod(
            kube, namespace=NAMESPACE, name=name, uid=uid, node="n1", annotations={}
        )
        assert bound.bound
    assert await asyncio.to_thread(watching.done.wait, 10)
    assert sorted(watching.bound) == sorted(uids)
    times = [watching.bound[name] for name in uids]
    assert times == sorted(times)
    assert watching.rate() > 0
    await asyncio.to_thread(watching._thread.join, 10)
    assert not watching._thread.is_alive()
