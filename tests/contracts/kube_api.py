"""A small Kubernetes API contract, through gpushare's own adapter (:mod:`gpushare.kube`).

A test module subclasses :class:`KubeApiContract` and provides ``kube``: a
:class:`KubeClient` on the API under test. The stand-in (``gpushare.embedded.kube_api``)
and the real kube-apiserver of ``tests/k8s`` both run it; what the real one does is the
specification. Pods go to ``default`` (it exists on both) under names unique per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from gpushare.core.pods import Pod
from gpushare.kube.binding import bind_pod
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import ConflictError, NotFound, PermanentError
from gpushare.kube.informer import Informer
from gpushare.kube.pod_source import KubernetesPodSource
from gpushare.kube.pods import get_pod, list_pods, patch_pod_annotations
from gpushare.kube.watching import PodEvent, watch_pods

NAMESPACE = "default"


def manifest(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": {"a": "1", "b": "2"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


async def create(kube: KubeClient, name: str, labels: dict[str, str] | None = None) -> str:
    """Create the pod through the API; its uid."""
    created = await kube.call(kube.core.create_namespaced_pod, NAMESPACE, manifest(name, labels))
    return str(created.metadata.uid)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class KubeApiContract:
    async def test_create_then_get(self, kube: KubeClient) -> None:
        name = unique("get")
        uid = await create(kube, name)
        pod = await get_pod(kube, NAMESPACE, name)
        assert pod is not None
        assert (pod.metadata.name, pod.metadata.namespace, pod.metadata.uid) == (
            name,
            NAMESPACE,
            uid,
        )
        assert pod.phase == "Pending"
        assert await get_pod(kube, NAMESPACE, unique("ghost")) is None

    async def test_a_second_create_conflicts(self, kube: KubeClient) -> None:
        name = unique("twice")
        await create(kube, name)
        with pytest.raises(ConflictError) as raised:
            await create(kube, name)
        assert raised.value.status == 409

    async def test_list_with_a_label_selector(self, kube: KubeClient) -> None:
        run = unique("run")
        await create(kube, unique("one"), {"run": run, "tier": "a"})
        await create(kube, unique("two"), {"run": run, "tier": "b"})
        await create(kube, unique("other"))
        listed = await list_pods(kube, label_selector=f"run={run}")
        assert sorted(p.metadata.labels["tier"] for p in listed.items) == ["a", "b"]
        tier_b = await list_pods(kube, label_selector=f"run={run},tier!=a")
        assert [p.metadata.labels["tier"] for p in tier_b.items] == ["b"]
        assert int(listed.resource_version) > 0

    async def test_a_list_in_pages_holds_every_pod_once(self, kube: KubeClient) -> None:
        run = unique("paged")
        names = [unique("page") for _ in range(5)]
        for name in names:
            await create(kube, name, {"run": run})
        raw = await kube.call_raw(
            kube.core.list_pod_for_all_namespaces, label_selector=f"run={run}", limit=2
        )
        first = json.loads(raw.body)
        assert len(first["items"]) <= 2
        assert first["metadata"]["continue"], "5 pods in pages of 2: more to come"
        listed = await list_pods(kube, label_selector=f"run={run}", page=2)
        assert sorted(p.metadata.name for p in listed.items) == sorted(names)
        assert int(listed.resource_version) > 0

    async def test_merge_patch_of_annotations(self, kube: KubeClient) -> None:
        name = unique("patch")
        uid = await create(kube, name)
        await patch_pod_annotations(kube, NAMESPACE, name, {"b": None, "c": "3"}, uid=uid)
        pod = await get_pod(kube, NAMESPACE, name)
        assert pod is not None
        assert pod.annotations == {"a": "1", "c": "3"}
        with pytest.raises(ConflictError) as raised:  # the uid: immutable, so 422
            await patch_pod_annotations(kube, NAMESPACE, name, {"d": "4"}, uid="another-uid")
        assert raised.value.status == 422
        with pytest.raises(NotFound):
            await patch_pod_annotations(kube, NAMESPACE, unique("ghost"), {"d": "4"})

    async def test_a_status_patch_naming_a_replaced_pod_changes_nothing(
        self, kube: KubeClient
    ) -> None:
        """How the kubelet (and the test kubelet) keeps a late status of a deleted pod off
        a new pod of the same name: its patch names the pod's uid, and another uid is
        refused (422) with nothing written."""
        name = unique("status")
        first = await create(kube, name)
        await kube.call(kube.core.delete_namespaced_pod, name, NAMESPACE, grace_period_seconds=0)
        second = await create(kube, name)
        late = {"metadata": {"uid": first}, "status": {"phase": "Failed", "reason": "Late"}}
        with pytest.raises(PermanentError) as raised:
            await kube.call(kube.core.patch_namespaced_pod_status, name, NAMESPACE, late)
        assert raised.value.status == 422
        assert "metadata.uid" in raised.value.message
        pod = await get_pod(kube, NAMESPACE, name)
        assert pod is not None
        assert (pod.metadata.uid, pod.phase) == (second, "Pending")
        current = {"metadata": {"uid": second}, "status": {"phase": "Running"}}
        await kube.call(kube.core.patch_namespaced_pod_status, name, NAMESPACE, current)
        pod = await get_pod(kube, NAMESPACE, name)
        assert pod is not None
        assert pod.phase == "Running"

    async def test_the_binding_subresource(self, kube: KubeClient) -> None:
        name = unique("bind")
        uid = await create(kube, name)
        ours = {"example.com/reservation": "r1"}
        outcome = await bind_pod(
            kube, namespace=NAMESPACE, name=name, uid=uid, node="node-x", annotations=ours
        )
        assert (outcome.result, outcome.status) == ("bound", 201)
        pod = await get_pod(kube, NAMESPACE, name)
        assert pod is not None
        assert pod.spec.node_name == "node-x"
        assert pod.annotations["example.com/reservation"] == "r1"
        again = await bind_pod(
            kube, namespace=NAMESPACE, name=name, uid=uid, node="node-y", annotations={}
        )
        assert (again.result, again.status) == ("refused", 409)
        missing = await bind_pod(
            kube, namespace=NAMESPACE, name=unique("ghost"), uid="u", node="node-x", annotations={}
        )
        assert (missing.result, missing.status) == ("refused", 404)

    async def test_watch_from_a_resource_version(self, kube: KubeClient) -> None:
        before = unique("before")
        await create(kube, before)
        listed = await list_pods(kube)
        after = unique("after")
        stream = watch_pods(kube, listed.resource_version, timeout_seconds=5)
        events: list[PodEvent] = []
        async with contextlib.aclosing(stream):
            await create(kube, after)
            await patch_pod_annotations(kube, NAMESPACE, before, {"seen": "yes"})
            await kube.call(kube.core.delete_namespaced_pod, after, NAMESPACE)
            async for event in stream:
                if event.pod.metadata.name in (before, after):
                    events.append(event)
                if events and events[-1].type == "DELETED":
                    break
        kinds = [(e.type, e.pod.metadata.name) for e in events]
        # A scheduler may add MODIFIED events of its own anywhere, even for the pod
        # listed before the watch began (its PodScheduled condition), so the order is
        # asserted per pod.
        assert next(kind for kind in kinds if kind[1] == after) == ("ADDED", after)
        assert ("ADDED", before) not in kinds
        patched = [e.pod for e in events if e.pod.metadata.name == before]
        assert any(pod.annotations.get("seen") == "yes" for pod in patched)
        assert kinds[-1] == ("DELETED", after)

    async def test_a_watch_asked_for_bookmarks_learns_the_version_of_a_quiet_selection(
        self, kube: KubeClient
    ) -> None:
        """A watch whose selection nothing changes still hears where the collection is
        now (a ``BOOKMARK``), while other objects change: what ``watch_raw`` resumes from.
        kube-apiserver sends it two seconds before the watch's deadline, and only when its
        cache has moved past where the watch began."""
        quiet = unique("quiet")
        listed = await list_pods(kube, label_selector=f"run={quiet}")
        query = {
            "watch": "true",
            "labelSelector": f"run={quiet}",
            "resourceVersion": listed.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "8",
        }
        url = f"{kube.base_url}/api/v1/namespaces/{NAMESPACE}/pods"
        async with kube.open_session(30) as session, session.get(url, params=query) as watch:
            for n in range(3):  # not selected: no run label
                made = await kube.call(
                    kube.core.create_namespaced_pod, NAMESPACE, manifest(f"{quiet}-{n}")
                )
            events = [json.loads(line) async for line in watch.content if line.strip()]
        assert events
        assert {event["type"] for event in events} == {"BOOKMARK"}
        assert {event["object"]["kind"] for event in events} == {"Pod"}
        bookmarked = int(events[-1]["object"]["metadata"]["resourceVersion"])
        assert bookmarked >= int(made.metadata.resource_version)

    async def test_the_pod_source_reads_from_its_informers_and_falls_back_to_get(
        self, kube: KubeClient
    ) -> None:
        """Unscheduled pods and nodes come from the informers (list, then watch); a pod
        under another UID, or one bound (it leaves ``spec.nodeName=``), is read by GET."""
        source = KubernetesPodSource(kube)
        source.start()
        try:
            async with asyncio.timeout(20):
                await source.pods.wait_synced()
                await source.nodes.wait_synced()
            name, node = unique("informed"), unique("node")
            uid = await create(kube, name)
            await kube.call(kube.core.create_node, node_manifest(node, {"tier": "a"}))
            await until(lambda: source.pods.get(f"{NAMESPACE}/{name}") is not None)
            await until(lambda: source.nodes.get(node) is not None)

            pod = await source.read_pod(NAMESPACE, name, uid)
            assert pod is not None
            assert pod.metadata.uid == uid
            found = await source.read_node(node)
            assert found is not None
            assert found.labels["tier"] == "a"
            assert source.cached_reads == 2

            # Another UID under the name: not trusted from the cache, the API answers.
            afresh = await source.read_pod(NAMESPACE, name, "another-uid")
            assert afresh is not None
            assert afresh.metadata.uid == uid
            assert source.cached_reads == 2

            # A label changed on the node reaches the cache through the watch.
            patch = {"metadata": {"labels": {"tier": "b"}}}
            await kube.call(kube.core.patch_node, node, patch)
            await until(lambda: (source.nodes.get(node) or found).labels.get("tier") == "b")

            # Bound, the pod leaves the informer; a read still finds it (GET).
            await bind_pod(kube, namespace=NAMESPACE, name=name, uid=uid, node=node, annotations={})
            await until(lambda: source.pods.get(f"{NAMESPACE}/{name}") is None)
            bound = await source.read_pod(NAMESPACE, name, uid)
            assert bound is not None
            assert bound.spec.node_name == node

            # Deleted, the node leaves the cache and the GET says it does not exist.
            await kube.call(kube.core.delete_node, node)
            await until(lambda: source.nodes.get(node) is None)
            assert await source.read_node(node) is None
        finally:
            await source.stop()

    async def test_an_informer_lists_in_pages_and_holds_every_object_once(
        self, kube: KubeClient
    ) -> None:
        """The list an informer starts from comes in pages (``limit``, ``continue``): five
        pods in pages of two are five pods, each once, then followed by the watch."""
        label = unique("paged")
        for n in range(5):
            await create(kube, f"{label}-{n}", labels={"informer": label})
        informer = pod_informer(kube, f"/api/v1/namespaces/{NAMESPACE}/pods", page=2)
        async with synced(informer):
            mine = sorted(name for name in informer.items() if name.startswith(label))
            assert mine == [f"{label}-{n}" for n in range(5)]
            await create(kube, f"{label}-5", labels={"informer": label})
            await until(lambda: informer.get(f"{label}-5") is not None)


def pod_informer(
    kube: KubeClient,
    path: str,
    *,
    page: int,
    field_selector: str | None = None,
    watch_seconds: int = 300,
    retry_seconds: float = 1.0,
) -> Informer[Pod]:
    """Pods at ``path`` by name, listed ``page`` at a time."""
    return Informer(
        kube,
        path,
        msgspec.json.Decoder(Pod).decode,
        lambda pod: pod.metadata.name,
        page=page,
        field_selector=field_selector,
        watch_seconds=watch_seconds,
        retry_seconds=retry_seconds,
    )


@contextlib.asynccontextmanager
async def synced(informer: Informer[Any], seconds: float = 20.0) -> AsyncIterator[None]:
    """``informer`` running with its first list taken; stopped on leaving."""
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(seconds):
            await informer.wait_synced()
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def node_manifest(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll ``condition`` (an informer's cache offers nothing to wait on)."""
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
