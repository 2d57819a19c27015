"""Custom resources in the API stand-in, through the official client over real HTTP: the
Device CRD from deploy/, its objects, status subresource, conflicts, schema and watch."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from gpushare.kube.device_objects import list_devices, write_device
from tests.integration.kube.waiting import eventually

call = asyncio.to_thread
CRD = Path(__file__).parents[3] / "deploy/base/crds/devices.gpushare.io.yaml"
GROUP, VERSION, PLURAL = "gpushare.io", "v1alpha1", "devices"


def device(name: str, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Device",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpushare-binder"}},
        "spec": {"nodeName": name},
    }
    if status:
        body["status"] = status
    return body


@pytest.fixture
def custom(kube: KubeClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api_client)


@pytest.fixture
async def installed(kube: KubeClient) -> dict[str, Any]:
    """The CRD, created through ``ApiextensionsV1Api`` from the YAML in deploy/."""
    api = client.ApiextensionsV1Api(kube.api_client)
    created = await call(
        api.create_custom_resource_definition,
        yaml.safe_load(CRD.read_text()),
        _preload_content=False,
    )
    body: dict[str, Any] = json.loads(created.data)
    return body


def status_code(error: pytest.ExceptionInfo[ApiException]) -> tuple[int, str]:
    return int(error.value.status or 0), json.loads(error.value.body).get("reason", "")


async def test_a_crd_is_established_and_listed_by_discovery(
    installed: dict[str, Any], kube: KubeClient
) -> None:
    conditions = {c["type"]: c["status"] for c in installed["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert installed["status"]["acceptedNames"]["kind"] == "Device"
    groups = await call(client.ApisApi(kube.api_client).get_api_versions)
    assert "gpushare.io" in [group.name for group in groups.groups]
    resources = await call(
        client.CustomObjectsApi(kube.api_client).get_api_resources, GROUP, VERSION
    )
    names = {(r.name, r.namespaced) for r in resources.resources}
    assert names == {("devices", False), ("devices/status", False)}


async def test_without_its_crd_a_custom_resource_is_not_found(
    custom: client.CustomObjectsApi,
) -> None:
    with pytest.raises(ApiException) as error:
        await call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, device("a"))
    assert error.value.status == 404


async def test_create_drops_the_status_and_the_status_subresource_writes_it(
    installed: dict[str, Any], custom: client.CustomObjectsApi
) -> None:
    created = await call(
        custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, device("a", cardCount=1)
    )
    assert "status" not in created
    assert (created["apiVersion"], created["metadata"]["generation"]) == ("gpushare.io/v1alpha1", 1)
    body = dict(created, status={"cardCount": 2, "healthy": "2/2"})
    written = await call(
        custom.replace_cluster_custom_object_status, GROUP, VERSION, PLURAL, "a", body
    )
    assert written["status"] == {"cardCount": 2, "healthy": "2/2"}
    # the main resource keeps the stored status; the status subresource keeps the spec
    changed = dict(written, spec={"nodeName": "b"}, status={"cardCount": 9})
    replaced = await call(
        custom.replace_cluster_custom_object, GROUP, VERSION, PLURAL, "a", changed
    )
    assert (replaced["spec"], replaced["status"]["cardCount"]) == ({"nodeName": "b"}, 2)
    assert replaced["metadata"]["generation"] == 2
    patched = await call(
        custom.patch_cluster_custom_object_status,
        GROUP,
        VERSION,
        PLURAL,
        "a",
        {"spec": {"nodeName": "c"}, "status": {"podCount": 3}},
    )
    assert patched["spec"] == {"nodeName": "b"}
    assert patched["status"] == {"cardCount": 2, "healthy": "2/2", "podCount": 3}


async def test_a_stale_resource_version_is_a_conflict(
    installed: dict[str, Any], custom: client.CustomObjectsApi
) -> None:
    created = await call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, device("a"))
    await call(
        custom.replace_cluster_custom_object_status,
        GROUP,
        VERSION,
        PLURAL,
        "a",
        dict(created, status={"cardCount": 1}),
    )
    with pytest.raises(ApiException) as error:
        await call(
            custom.replace_cluster_custom_object_status,
            GROUP,
            VERSION,
            PLURAL,
            "a",
            dict(created, status={"cardCount": 2}),
        )
    assert status_code(error) == (409, "Conflict")
    with pytest.raises(ApiException) as again:
        await call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, device("a"))
    assert status_code(again) == (409, "AlreadyExists")


async def test_the_schema_prunes_unknown_fields_and_refuses_wrong_types(
    installed: dict[str, Any], custom: client.CustomObjectsApi
) -> None:
    created = await call(
        custom.create_cluster_custom_object,
        GROUP,
        VERSION,
        PLURAL,
        dict(device("a"), extra={"x": 1}),
    )
    assert "extra" not in created
    status = {"cardCount": 1, "surprise": True, "cards": [{"index": 0, "uuid": "GPU-0"}]}
    with pytest.raises(ApiException) as error:
        await call(
            custom.replace_cluster_custom_object_status,
            GROUP,
            VERSION,
            PLURAL,
            "a",
            dict(created, status=status),
        )
    assert status_code(error) == (422, "Invalid")
    assert "status.cards[0].model: Required value" in json.loads(error.value.body)["message"]
    with pytest.raises(ApiException) as wrong:
        await call(
            custom.patch_cluster_custom_object_status,
            GROUP,
            VERSION,
            PLURAL,
            "a",
            {"status": {"cardCount": "two"}},
        )
    assert status_code(wrong) == (422, "Invalid")
    patched = await call(
        custom.patch_cluster_custom_object_status,
        GROUP,
        VERSION,
        PLURAL,
        "a",
        {"status": {"cardCount": 1, "surprise": True}},
    )
    assert patched["status"] == {"cardCount": 1}


async def test_list_watch_and_delete(
    installed: dict[str, Any], custom: client.CustomObjectsApi, kube: KubeClient
) -> None:
    await call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, device("a"))
    unmanaged = dict(device("b"), metadata={"name": "b"})
    await call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, unmanaged)
    listed = await call(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
    assert (listed["kind"], listed["apiVersion"]) == ("DeviceList", "gpushare.io/v1alpha1")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a", "b"]
    assert await list_devices(kube) == ["a"]

    seen: list[tuple[str, str]] = []
    watcher = watch.Watch()

    def follow() -> None:
        stream = watcher.stream(
            custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=10,
        )
        for event in stream:
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if event["type"] == "DELETED":
                watcher.stop()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    await call(custom.delete_cluster_custom_object, GROUP, VERSION, PLURAL, "a")
    await eventually(lambda: ("DELETED", "a") in seen)
    await call(thread.join)
    with pytest.raises(ApiException) as error:
        await call(custom.get_cluster_custom_object, GROUP, VERSION, PLURAL, "a")
    assert error.value.status == 404


async def test_deleting_the_crd_deletes_its_objects(
    installed: dict[str, Any], custom: client.CustomObjectsApi, kube_api: KubeApiServer
) -> None:
    await call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, device("a"))
    api = client.ApiextensionsV1Api(custom.api_client)
    await call(api.delete_custom_resource_definition, "devices.gpushare.io")
    assert kube_api.get("devices.gpushare.io", "a") is None
    with pytest.raises(ApiException) as error:
        await call(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
    assert error.value.status == 404


async def test_write_device_creates_then_updates_and_never_goes_backwards(
    installed: dict[str, Any], kube: KubeClient, kube_api: KubeApiServer
) -> None:
    body = device("a", cardCount=1, lastSeq=5)
    version = await write_device(kube, body)
    stored = kube_api.get("devices.gpushare.io", "a")
    assert stored is not None
    assert stored["status"] == {"cardCount": 1, "lastSeq": 5}
    assert stored["metadata"]["resourceVersion"] == version
    # someone else wrote in between: the known version is stale, the write reads and retries
    kube_api.store.write("devices.gpushare.io", dict(stored, status={"cardCount": 0}))
    await write_device(kube, device("a", cardCount=2, lastSeq=6), version)
    assert (kube_api.get("devices.gpushare.io", "a") or {})["status"]["cardCount"] == 2
    # a replica behind the log leaves a newer Device alone
    await write_device(kube, device("a", cardCount=7, lastSeq=4))
    assert (kube_api.get("devices.gpushare.io", "a") or {})["status"]["cardCount"] == 2


def get_table(url: str) -> dict[str, Any]:
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read())
        return body


async def test_kubectl_gets_a_table_with_the_printer_columns(
    installed: dict[str, Any], custom: client.CustomObjectsApi, kube_api: KubeApiServer
) -> None:
    created = await call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, device("a"))
    status = {"cardCount": 2, "model": "Tesla T4", "memoryMiB": 30720, "allocatedMiB": 1024}
    status |= {"healthy": "1/2", "podCount": 1, "lastSeq": 7}
    await call(
        custom.replace_cluster_custom_object_status,
        GROUP,
        VERSION,
        PLURAL,
        "a",
        dict(created, status=status),
    )
    url = f"{kube_api.url}/apis/{GROUP}/{VERSION}/{PLURAL}"
    table = await call(get_table, url)
    assert table["kind"] == "Table"
    names = [(c["name"], c["priority"]) for c in table["columnDefinitions"]]
    assert names[:8] == [
        ("Name", 0),
        ("Cards", 0),
        ("Model", 0),
        ("Memory(MiB)", 0),
        ("Allocated(MiB)", 0),
        ("Healthy", 0),
        ("Pods", 0),
        ("Node", 1),
    ]
    [row] = table["rows"]
    assert row["cells"][:8] == ["a", 2, "Tesla T4", 30720, 1024, "1/2", 1, "a"]
    assert row["cells"][-1].endswith("s")  # Age: seconds old
    assert row["object"]["metadata"]["name"] == "a"
    one = await call(get_table, f"{url}/a")
    assert [r["cells"][0] for r in one["rows"]] == ["a"]
