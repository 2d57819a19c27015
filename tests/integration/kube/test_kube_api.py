"""The Kubernetes API stand-in, driven by the official client over real HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from gpushare.embedded.kube_api import KubeApiServer
from gpushare.embedded.nats_server import free_port
from tests.integration.kube.waiting import eventually

call = asyncio.to_thread


def pod_manifest(name: str, node: str | None = None, **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def binding(name: str, node: str, uid: str | None = None, **annotations: str) -> client.V1Binding:
    return client.V1Binding(
        metadata=client.V1ObjectMeta(name=name, uid=uid, annotations=annotations),
        target=client.V1ObjectReference(kind="Node", name=node),
    )


def status_of(error: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


class Collector:
    """Runs ``kubernetes.watch.Watch().stream`` in a thread and keeps what it yields."""

    def __init__(self, method: Any, *args: Any, **kwargs: Any) -> None:
        self.events: list[tuple[str, str]] = []
        self.error: BaseException | None = None
        self.stopped = False
        self.watch = watch.Watch()
        self.thread = threading.Thread(target=self._run, args=(method, args, kwargs))
        self.thread.start()

    def _run(self, method: Any, args: Any, kwargs: Any) -> None:
        try:
            for event in self.watch.stream(method, *args, **kwargs):
                self.events.append((event["type"], event["object"].metadata.name))
        except BaseException as error:
            if not self.stopped:  # stopping shuts the socket: the read then fails by design
                self.error = error

    async def stop(self) -> None:
        self.stopped = True
        self.watch.stop()
        await call(self.thread.join, 10)


async def test_create_assigns_identity_and_pending_phase(core: CoreV1Api) -> None:
    created = await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.resource_version
    assert created.status.phase == "Pending"
    assert created.spec.scheduler_name == "default-scheduler"
    read = await call(core.read_namespaced_pod, "p1", "default")
    assert read.metadata.uid == created.metadata.uid
    listed = await call(core.list_pod_for_all_namespaces)
    assert [pod.metadata.name for pod in listed.items] == ["p1"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)


async def test_create_refuses_duplicates_invalid_pods_and_unknown_namespaces(
    core: CoreV1Api,
) -> None:
    await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    with pytest.raises(ApiException) as duplicate:
        await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    assert duplicate.value.status == 409
    assert status_of(duplicate.value)["reason"] == "AlreadyExists"
    no_image = {"metadata": {"name": "p2"}, "spec": {"containers": [{"name": "main"}]}}
    with pytest.raises(ApiException) as invalid:
        await call(core.create_namespaced_pod, "default", no_image)
    assert invalid.value.status == 422
    with pytest.raises(ApiException) as missing:
        await call(core.create_namespaced_pod, "nowhere", pod_manifest("p3"))
    assert missing.value.status == 404
    assert status_of(missing.value)["message"] == 'namespaces "nowhere" not found'


async def test_list_honours_field_and_label_selectors(core: CoreV1Api) -> None:
    await call(core.create_namespace, {"metadata": {"name": "team"}})
    await call(core.create_namespaced_pod, "default", pod_manifest("a", "n1", app="x"))
    await call(core.create_namespaced_pod, "default", pod_manifest("b", "n2", app="y"))
    await call(core.create_namespaced_pod, "team", pod_manifest("c", None, app="x", tier="gpu"))

    async def names(**selectors: str) -> list[str]:
        pods = await call(core.list_pod_for_all_namespaces, **selectors)
        return sorted(pod.metadata.name for pod in pods.items)

    assert await names(field_selector="spec.nodeName=n1") == ["a"]
    assert await names(field_selector="spec.nodeName=") == ["c"]
    assert await names(field_selector="spec.nodeName!=n1,metadata.namespace=default") == ["b"]
    assert await names(label_selector="app=x") == ["a", "c"]
    assert await names(label_selector="app in (x,y),!tier") == ["a", "b"]
    assert await names(label_selector="tier,app notin (y)") == ["c"]
    team = await call(core.list_namespaced_pod, "team")
    assert [pod.metadata.name for pod in team.items] == ["c"]
    with pytest.raises(ApiException) as unsupported:
        await call(core.list_pod_for_all_namespaces, field_selector="spec.hostname=x")
    assert unsupported.value.status == 400


async def test_watch_sends_existing_objects_then_live_changes(core: CoreV1Api) -> None:
    await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    collector = Collector(core.list_namespaced_pod, "default")
    try:
        await eventually(lambda: len(collector.events) == 1)
        await call(core.create_namespaced_pod, "default", pod_manifest("p2"))
        patch = {"metadata": {"labels": {"seen": "yes"}}}
        await call(core.patch_namespaced_pod, "p1", "default", patch)
        await call(core.delete_namespaced_pod, "p2", "default")
        await eventually(lambda: len(collector.events) == 4)
    finally:
        await collector.stop()
    assert collector.error is None
    assert collector.events == [
        ("ADDED", "p1"),
        ("ADDED", "p2"),
        ("MODIFIED", "p1"),
        ("DELETED", "p2"),
    ]


async def test_watch_with_field_selector_sees_objects_leave_it(core: CoreV1Api) -> None:
    created = await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    collector = Collector(
        core.list_pod_for_all_namespaces, field_selector="spec.nodeName=", timeout_seconds=30
    )
    try:
        await eventually(lambda: len(collector.events) == 1)
        body = binding("p1", "n1", created.metadata.uid)
        bound = await call(
            core.create_namespaced_pod_binding, "p1", "default", body, _preload_content=False
        )
        assert bound.data
        await call(core.create_namespaced_pod, "default", pod_manifest("bound", "n2"))
        await call(core.create_namespaced_pod, "default", pod_manifest("p2"))
        await eventually(lambda: len(collector.events) == 3)
    finally:
        await collector.stop()
    assert collector.events == [("ADDED", "p1"), ("DELETED", "p1"), ("ADDED", "p2")]


async def test_watch_resumes_from_a_resource_version(core: CoreV1Api) -> None:
    await call(core.create_namespaced_pod, "default", pod_manifest("before"))
    listed = await call(core.list_namespaced_pod, "default")
    await call(core.create_namespaced_pod, "default", pod_manifest("after"))
    collector = Collector(
        core.list_namespaced_pod,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=30,
    )
    try:
        await eventually(lambda: len(collector.events) == 1)
    finally:
        await collector.stop()
    assert collector.events == [("ADDED", "after")]


async def test_watch_from_a_compacted_resource_version_is_gone(tmp_path: Path) -> None:
    async with KubeApiServer(history_size=2) as server:
        for name in ("a", "b", "c", "d"):
            server.create_pod(pod_manifest(name))
        api = config.new_client_from_config(str(server.write_kubeconfig(tmp_path / "kc")))
        core = CoreV1Api(api)
        lines: list[dict[str, Any]] = []

        def read() -> None:
            response = core.list_namespaced_pod(
                "default", watch=True, resource_version="1", _preload_content=False
            )
            lines.extend(json.loads(line) for line in response.read().splitlines())

        await call(read)
        api.close()
    assert len(lines) == 1
    assert lines[0]["type"] == "ERROR"
    assert lines[0]["object"]["code"] == 410


async def test_merge_patch_strategic_merge_patch_and_json_patch(core: CoreV1Api) -> None:
    manifest = pod_manifest("p1")
    manifest["metadata"]["annotations"] = {"keep": "1", "drop": "2"}
    manifest["spec"]["containers"].append({"name": "side", "image": "alpine"})
    await call(core.create_namespaced_pod, "default", manifest)
    merge = {"metadata": {"annotations": {"drop": None, "new": "3"}}}
    patched = await call(
        core.patch_namespaced_pod,
        "p1",
        "default",
        merge,
        _content_type="application/merge-patch+json",
    )
    assert patched.metadata.annotations == {"keep": "1", "new": "3"}
    strategic = {"spec": {"containers": [{"name": "side", "image": "alpine:3"}]}}
    patched = await call(core.patch_namespaced_pod, "p1", "default", strategic)
    assert [(c.name, c.image) for c in patched.spec.containers] == [
        ("main", "busybox"),
        ("side", "alpine:3"),
    ]
    operations = [{"op": "test", "path": "/metadata/annotations/keep", "value": "nope"}]
    with pytest.raises(ApiException) as failed_test:
        await call(core.patch_namespaced_pod, "p1", "default", operations)
    assert failed_test.value.status == 422
    operations = [{"op": "add", "path": "/metadata/annotations/json", "value": "4"}]
    patched = await call(core.patch_namespaced_pod, "p1", "default", operations)
    assert patched.metadata.annotations["json"] == "4"


async def test_stale_resource_version_in_a_patch_is_a_conflict(core: CoreV1Api) -> None:
    created = await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    first = {
        "metadata": {"resourceVersion": created.metadata.resource_version, "labels": {"a": "1"}}
    }
    updated = await call(core.patch_namespaced_pod, "p1", "default", first)
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    stale = {
        "metadata": {"resourceVersion": created.metadata.resource_version, "labels": {"a": "2"}}
    }
    with pytest.raises(ApiException) as conflict:
        await call(core.patch_namespaced_pod, "p1", "default", stale)
    assert conflict.value.status == 409
    assert "the object has been modified" in status_of(conflict.value)["message"]
    current = await call(core.read_namespaced_pod, "p1", "default")
    assert current.metadata.labels == {"a": "1"}
    unchanged = await call(core.patch_namespaced_pod, "p1", "default", {"metadata": {}})
    assert unchanged.metadata.resource_version == current.metadata.resource_version


async def test_replace_checks_the_resource_version(core: CoreV1Api) -> None:
    created = await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    created.metadata.labels = {"replaced": "yes"}
    replaced = await call(core.replace_namespaced_pod, "p1", "default", created)
    assert replaced.metadata.labels == {"replaced": "yes"}
    assert replaced.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as stale:
        await call(core.replace_namespaced_pod, "p1", "default", created)
    assert stale.value.status == 409
    replaced.status.phase = "Running"
    running = await call(core.replace_namespaced_pod_status, "p1", "default", replaced)
    assert running.status.phase == "Running"


async def test_status_goes_through_the_status_subresource_only(core: CoreV1Api) -> None:
    await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    ignored = await call(
        core.patch_namespaced_pod, "p1", "default", {"status": {"phase": "Failed"}}
    )
    assert ignored.status.phase == "Pending"
    running = {"status": {"phase": "Running"}, "metadata": {"labels": {"ignored": "yes"}}}
    patched = await call(core.patch_namespaced_pod_status, "p1", "default", running)
    assert patched.status.phase == "Running"
    assert not patched.metadata.labels
    with pytest.raises(ApiException) as immutable:
        await call(core.patch_namespaced_pod, "p1", "default", {"spec": {"nodeName": "n9"}})
    assert immutable.value.status == 422


async def test_nodes_and_their_status(core: CoreV1Api) -> None:
    node = {"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "8"}}}
    created = await call(core.create_node, node)
    assert created.status.allocatable == {"cpu": "8"}
    count = {"status": {"capacity": {"aliyun.com/gpu-count": "2"}}}
    patched = await call(
        core.patch_node_status, "n1", count, _content_type="application/merge-patch+json"
    )
    assert patched.status.capacity == {"cpu": "8", "aliyun.com/gpu-count": "2"}
    nodes = await call(core.list_node, label_selector="")
    assert [n.metadata.name for n in nodes.items] == ["n1"]
    collector = Collector(core.list_node, timeout_seconds=30)
    try:
        # the watch is open once it has said what exists; a patch before that would be in
        # its ADDED (a loaded CI machine started the thread late: one event, not two)
        await eventually(lambda: len(collector.events) == 1)
        await call(core.patch_node, "n1", {"metadata": {"labels": {"gpu": "yes"}}})
        await eventually(lambda: len(collector.events) == 2)
    finally:
        await collector.stop()
    assert collector.events == [("ADDED", "n1"), ("MODIFIED", "n1")]


async def test_binding_assigns_the_node_and_merges_annotations(core: CoreV1Api) -> None:
    manifest = pod_manifest("p1")
    manifest["metadata"]["annotations"] = {"mine": "1"}
    created = await call(core.create_namespaced_pod, "default", manifest)
    body = binding("p1", "n1", created.metadata.uid, theirs="2")
    response = await call(
        core.create_namespaced_pod_binding, "p1", "default", body, _preload_content=False
    )
    assert response.status == 201
    assert json.loads(response.data) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    pod = await call(core.read_namespaced_pod, "p1", "default")
    assert pod.spec.node_name == "n1"
    assert pod.metadata.annotations == {"mine": "1", "theirs": "2"}
    assert [(c.type, c.status) for c in pod.status.conditions] == [("PodScheduled", "True")]


async def test_binding_conflicts(core: CoreV1Api) -> None:
    created = await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    with pytest.raises(ApiException) as wrong_uid:
        await call(
            core.create_namespaced_pod_binding,
            "p1",
            "default",
            binding("p1", "n1", "not-the-uid"),
            _preload_content=False,
        )
    assert wrong_uid.value.status == 409
    assert "Precondition failed: UID in precondition" in status_of(wrong_uid.value)["message"]
    legacy = await call(
        core.create_namespaced_binding,
        "default",
        binding("p1", "n1", created.metadata.uid),
        _preload_content=False,
    )
    assert legacy.status == 201
    assert json.loads(legacy.data)["status"] == "Success"  # reading it frees the connection
    with pytest.raises(ApiException) as again:
        await call(
            core.create_namespaced_pod_binding,
            "p1",
            "default",
            binding("p1", "n2"),
            _preload_content=False,
        )
    assert again.value.status == 409
    assert 'pod p1 is already assigned to node "n1"' in status_of(again.value)["message"]
    with pytest.raises(ApiException) as missing:
        await call(
            core.create_namespaced_pod_binding,
            "ghost",
            "default",
            binding("ghost", "n1"),
            _preload_content=False,
        )
    assert missing.value.status == 404


async def test_delete_and_finalizers(core: CoreV1Api) -> None:
    await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    deleted = await call(core.delete_namespaced_pod, "p1", "default")
    assert deleted.metadata.name == "p1"
    with pytest.raises(ApiException) as gone:
        await call(core.read_namespaced_pod, "p1", "default")
    assert gone.value.status == 404
    held = pod_manifest("p2")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    await call(core.create_namespaced_pod, "default", held)
    marked = await call(core.delete_namespaced_pod, "p2", "default")
    assert marked.metadata.deletion_timestamp is not None
    release = {"metadata": {"finalizers": None}}
    await call(
        core.patch_namespaced_pod,
        "p2",
        "default",
        release,
        _content_type="application/merge-patch+json",
    )
    with pytest.raises(ApiException) as finished:
        await call(core.read_namespaced_pod, "p2", "default")
    assert finished.value.status == 404


async def test_a_pod_on_a_node_is_deleted_gracefully(core: CoreV1Api) -> None:
    await call(core.create_namespaced_pod, "default", pod_manifest("p1", "n1"))
    terminating = await call(core.delete_namespaced_pod, "p1", "default")
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 30
    still = await call(core.read_namespaced_pod, "p1", "default")
    assert still.metadata.deletion_timestamp is not None
    failed = {"status": {"phase": "Failed"}}
    await call(core.patch_namespaced_pod_status, "p1", "default", failed)  # the kubelet's part
    await call(core.delete_namespaced_pod, "p1", "default", grace_period_seconds=0)
    with pytest.raises(ApiException) as gone:
        await call(core.read_namespaced_pod, "p1", "default")
    assert gone.value.status == 404


async def test_injected_faults_fail_before_touching_state(
    kube_api: KubeApiServer, core: CoreV1Api
) -> None:
    created = await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    kube_api.fail_next("POST", r"/pods/p1/binding$", 500, "etcd is on fire")
    body = binding("p1", "n1", created.metadata.uid)
    with pytest.raises(ApiException) as injected:
        await call(
            core.create_namespaced_pod_binding, "p1", "default", body, _preload_content=False
        )
    assert injected.value.status == 500
    assert status_of(injected.value)["message"] == "etcd is on fire"
    assert (await call(core.read_namespaced_pod, "p1", "default")).spec.node_name is None
    response = await call(
        core.create_namespaced_pod_binding, "p1", "default", body, _preload_content=False
    )
    assert (response.status, json.loads(response.data)["code"]) == (201, 201)
    assert [r.status for r in kube_api.requests("POST", "/binding$")] == [500, 201]


async def test_faults_over_http(kube_api: KubeApiServer, core: CoreV1Api) -> None:
    rule = {"verb": "GET", "path": "/namespaces/default/pods/p1$", "status": 409, "times": 2}

    def post_fault() -> dict[str, Any]:
        request = urllib.request.Request(
            f"{kube_api.url}/_gpushare/faults",
            data=json.dumps(rule).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            answer: dict[str, Any] = json.loads(reply.read())
            return answer

    assert (await call(post_fault))["faults"][0]["status"] == 409
    await call(core.create_namespaced_pod, "default", pod_manifest("p1"))
    for _ in range(2):
        with pytest.raises(ApiException) as injected:
            await call(core.read_namespaced_pod, "p1", "default")
        assert injected.value.status == 409
    assert (await call(core.read_namespaced_pod, "p1", "default")).metadata.name == "p1"


async def test_discovery(kube_api: KubeApiServer, core: CoreV1Api) -> None:
    version = await call(client.VersionApi(core.api_client).get_code)
    assert version.major == "1"
    resources = await call(core.get_api_resources)
    names = {resource.name for resource in resources.resources}
    assert {"pods", "pods/binding", "pods/status", "nodes", "nodes/status", "bindings"} <= names
    versions = await call(client.CoreApi(core.api_client).get_api_versions)
    assert versions.versions == ["v1"]


def test_runs_as_a_process_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpushare.cli.main", "kube-api", "--port", str(port)),
            *("--kubeconfig-out", str(out), "--node", "gpu-a"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert Path(process.stdout.readline().strip()) == out.resolve()
        api = config.new_client_from_config(str(out))
        nodes = CoreV1Api(api).list_node()
        assert [node.metadata.name for node in nodes.items] == ["gpu-a"]
        api.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
