"""Nobody but the API is believed at bind, and nobody unauthenticated reads ``/inspect``.

The attacks of the issue "the extender trusts whoever calls it", each over real HTTP(S)
against an allocator on a real nats-server, reading pods and nodes from the Kubernetes API
stand-in: a direct bind to a node the pod's own constraints exclude, a forged filter body
that shrinks the request, and ``/inspect`` (every pod) read by anyone.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from nats.js import JetStreamContext

from gpushare.allocator.runtime import running_allocator
from gpushare.bus.log import AllocationLog
from gpushare.core.events import PodReserved
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from gpushare.kube.pod_source import KubernetesPodSource
from tests.integration.allocator.doubles import BinderDouble
from tests.integration.allocator.serving import allocator_settings, publish
from tests.integration.allocator.test_https import Pki, make_pki
from tests.unit.allocator.builders import binding_args, card, gpu_pod, inventory, names_args
from tests.unit.allocator.test_admission import VALIDATE, admission_review, allowed, stored_pod

PREFIX = "/gpushare-scheduler"
FILTER = f"{PREFIX}/filter"
BIND = f"{PREFIX}/bind"
INSPECT = f"{PREFIX}/inspect"
NODES = ("gpu-a", "gpu-b")
HOSTNAME = "kubernetes.io/hostname"


async def create_node(kube: KubeClient, name: str, *taints: dict[str, str]) -> None:
    """A Node through the API, labelled with its hostname like a kubelet's, maybe tainted."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": {HOSTNAME: name}},
        "spec": {"taints": list(taints)},
    }
    await kube.call(kube.core.create_node, body)


async def create_pod(kube_api: KubeApiServer, name: str, mib: int, **spec: Any) -> dict[str, Any]:
    """A GPU pod as the API stores it (with its real UID), extra ``spec`` fields merged."""
    manifest = gpu_pod(name, mib)
    manifest["spec"].update(spec)
    del manifest["metadata"]["uid"]
    return kube_api.create_pod(manifest)


@pytest.fixture
async def cluster(
    js: JetStreamContext, kube_api: KubeApiServer, kube: KubeClient
) -> AsyncIterator[tuple[httpx.AsyncClient, JetStreamContext]]:
    """Two nodes of two 16 GiB cards in the log and in the API (gpu-b tainted), an
    allocator reading the API, and a binder double that binds every reservation."""
    await publish(js, [inventory(n, [card(n, 0), card(n, 1)]) for n in NODES])
    await create_node(kube, "gpu-a")
    await create_node(kube, "gpu-b", {"key": "dedicated", "value": "ml", "effect": "NoSchedule"})
    source = KubernetesPodSource(kube)
    async with (
        running_allocator(js, allocator_settings(), pod_source=source) as running,
        httpx.AsyncClient(base_url=running.url, timeout=30) as http,
        BinderDouble(js),
    ):
        yield http, js


async def bind(http: httpx.AsyncClient, pod: dict[str, Any], node: str) -> str:
    response = await http.post(BIND, content=binding_args(pod, node))
    assert response.status_code == 200
    error: str = response.json()["Error"]
    return error


async def reserved_mib(js: JetStreamContext, uid: str) -> int | None:
    """What the log reserved for the pod, summed over its shares; None: no ``PodReserved``
    for it at all (the raw log, not only the fold)."""
    log = AllocationLog(js)
    reservations = [
        event
        for node in NODES
        async for _, event in log.read_node(node, 0)
        if isinstance(event, PodReserved) and event.pod.uid == uid
    ]
    if not reservations:
        return None
    [reservation] = reservations
    return sum(share.memory_mib for share in reservation.shares)


async def test_a_direct_bind_to_a_node_its_node_selector_excludes_is_refused(
    cluster: tuple[httpx.AsyncClient, JetStreamContext], kube_api: KubeApiServer
) -> None:
    http, js = cluster
    pinned = await create_pod(kube_api, "pinned", 4096, nodeSelector={HOSTNAME: "gpu-a"})
    toleration = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    tolerant = await create_pod(
        kube_api,
        "pinned-tolerant",
        4096,
        nodeSelector={HOSTNAME: "gpu-a"},
        tolerations=[toleration],
    )
    for pod in (pinned, tolerant):  # no filter at all: straight to bind, as an attacker would
        error = await bind(http, pod, "gpu-b")
        assert "excluded by the pod's nodeSelector" in error, error
        assert f"{HOSTNAME}=gpu-a" in error
        assert await reserved_mib(js, pod["metadata"]["uid"]) is None
    assert await bind(http, pinned, "gpu-a") == ""
    assert await reserved_mib(js, pinned["metadata"]["uid"]) == 4096


async def test_a_forged_filter_cannot_shrink_what_bind_reserves(
    cluster: tuple[httpx.AsyncClient, JetStreamContext], kube_api: KubeApiServer
) -> None:
    http, js = cluster
    real = await create_pod(kube_api, "big", 8192)
    forged = json.loads(json.dumps(real))  # same name and UID, claiming 512 MiB
    for container in forged["spec"]["containers"]:
        container["resources"] = {
            "limits": {"aliyun.com/gpu-mem": "512"},
            "requests": {"aliyun.com/gpu-mem": "512"},
        }
    filtered = (await http.post(FILTER, content=names_args(forged, ["gpu-a"]))).json()
    assert filtered["NodeNames"] == ["gpu-a"]
    assert await bind(http, forged, "gpu-a") == ""
    assert await reserved_mib(js, real["metadata"]["uid"]) == 8192


async def test_another_pod_of_the_same_name_is_refused(
    cluster: tuple[httpx.AsyncClient, JetStreamContext], kube_api: KubeApiServer
) -> None:
    http, js = cluster
    real = await create_pod(kube_api, "p", 1024)
    impostor = gpu_pod("p", 512, uid="uid-forged")
    await http.post(FILTER, content=names_args(impostor, ["gpu-a"]))
    error = await bind(http, impostor, "gpu-a")
    assert f"it has uid {real['metadata']['uid']}, bind asked for uid-forged" in error
    assert await reserved_mib(js, "uid-forged") is None


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def required_affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }


@pytest.mark.parametrize(
    ("spec", "node", "expected"),
    [
        ({}, "gpu-b", "untolerated taint(s) dedicated=ml:NoSchedule"),
        (
            {"tolerations": [{"key": "dedicated", "value": "other", "effect": "NoSchedule"}]},
            "gpu-b",
            "untolerated taint(s) dedicated=ml:NoSchedule",
        ),
        ({"tolerations": [{"key": "dedicated", "value": "ml"}]}, "gpu-b", ""),
        ({"tolerations": [{"operator": "Exists"}]}, "gpu-b", ""),
        (
            {"nodeName": "gpu-a"},
            "gpu-b",
            "excluded by the pod's nodeName: the pod names node gpu-a",
        ),
        (
            required_affinity(
                {"matchExpressions": [expression(HOSTNAME, "NotIn", "gpu-a")]},
            ),
            "gpu-a",
            "excluded by the pod's required node affinity",
        ),
        (
            required_affinity(
                {"matchExpressions": [expression(HOSTNAME, "In", "gpu-b")]},
                {"matchFields": [expression("metadata.name", "In", "gpu-a")]},
            ),
            "gpu-a",
            "",
        ),
    ],
    ids=[
        "untolerated",
        "other-value",
        "tolerated",
        "tolerates-all",
        "node-name",
        "affinity-not-in",
        "affinity-either-term",
    ],
)
async def test_the_pods_taints_and_affinity_are_checked_at_bind(
    cluster: tuple[httpx.AsyncClient, JetStreamContext],
    kube_api: KubeApiServer,
    spec: dict[str, Any],
    node: str,
    expected: str,
) -> None:
    http, js = cluster
    pod = await create_pod(kube_api, "p", 2048, **spec)
    error = await bind(http, pod, node)
    uid = pod["metadata"]["uid"]
    if expected:
        assert expected in error, error
        assert await reserved_mib(js, uid) is None
    else:
        assert error == ""
        assert await reserved_mib(js, uid) == 2048


async def test_a_node_the_api_does_not_know_is_refused(
    cluster: tuple[httpx.AsyncClient, JetStreamContext], kube_api: KubeApiServer
) -> None:
    http, js = cluster
    pod = await create_pod(kube_api, "p", 1024)
    assert "node gpu-z: the node does not exist" in await bind(http, pod, "gpu-z")
    assert await reserved_mib(js, pod["metadata"]["uid"]) is None


# --- /inspect ------------------------------------------------------------------------


@pytest.mark.parametrize(("inspect_open", "status"), [(False, 403), (True, 200)])
async def test_inspect_over_plain_http_needs_inspect_open(
    js: JetStreamContext, inspect_open: bool, status: int
) -> None:
    await publish(js, [inventory("gpu-a", [card("gpu-a", 0)])])
    settings = allocator_settings(inspect_open=inspect_open)
    async with (
        running_allocator(js, settings) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        for path in (INSPECT, f"{INSPECT}/gpu-a"):
            response = await http.get(path)
            assert response.status_code == status, path
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
    if not inspect_open:
        assert "--inspect-open" in response.json()["error"]


# --- client certificates --------------------------------------------------------------


def client_context(pki: Pki, certificate: trustme.LeafCert | None = None) -> ssl.SSLContext:
    context = pki.client_context()
    if certificate is not None:
        certificate.configure_cert(context)
    return context


async def test_with_a_client_ca_only_its_clients_reach_the_verbs_and_inspect(
    js: JetStreamContext, tmp_path: Path
) -> None:
    server, clients, stranger = (make_pki(tmp_path / d) for d in ("server", "clients", "other"))
    scheduler = clients.ca.issue_cert("kube-scheduler")
    forged = stranger.ca.issue_cert("kube-scheduler")  # same name, another CA
    await publish(js, [inventory("gpu-a", [card("gpu-a", 0)])])
    pod = gpu_pod("p", 1024)
    settings = allocator_settings(tls=server.tls(client_ca_file=str(clients.ca_file)))
    async with running_allocator(js, settings) as running:
        async with httpx.AsyncClient(base_url=running.url, verify=client_context(server)) as http:
            # No certificate: the TLS handshake lets it through, the gate answers 403 before
            # any verb reads the body.
            for path, body in (
                (FILTER, names_args(pod, ["gpu-a"])),
                (BIND, binding_args(pod, "gpu-a")),
                (f"{PREFIX}/prioritize", names_args(pod, ["gpu-a"])),
            ):
                response = await http.post(path, content=body)
                assert response.status_code == 403, path
                assert "client certificate" in response.json()["error"]
            assert (await http.get(INSPECT)).status_code == 403
            assert (await http.get(f"{INSPECT}/gpu-a")).status_code == 403
            # The probes, the metrics and the webhook stay open to callers that hold none.
            for path in ("/healthz", "/readyz", "/metrics"):
                assert (await http.get(path)).status_code == 200, path
            review = admission_review(stored_pod("p", 1024))
            assert (await http.post(VALIDATE, json=review)).json() == allowed()
        # A certificate the client CA did not sign fails the handshake itself.
        verify = client_context(server, forged)
        async with httpx.AsyncClient(base_url=running.url, verify=verify) as http:
            with pytest.raises(httpx.TransportError):
                await http.get("/healthz")
        async with httpx.AsyncClient(
            base_url=running.url, verify=client_context(server, scheduler)
        ) as http:
            filtered = await http.post(FILTER, content=names_args(pod, ["gpu-a"]))
            assert filtered.status_code == 200
            assert filtered.json()["NodeNames"] == ["gpu-a"]
            assert (await http.get(INSPECT)).status_code == 200
            [node] = (await http.get(f"{INSPECT}/gpu-a")).json()["nodes"]
            assert node["name"] == "gpu-a"


async def test_inspect_open_with_a_client_ca_opens_inspect_only(
    js: JetStreamContext, tmp_path: Path
) -> None:
    server, clients = make_pki(tmp_path / "server"), make_pki(tmp_path / "clients")
    tls = server.tls(client_ca_file=str(clients.ca_file))
    async with (
        running_allocator(js, allocator_settings(tls=tls, inspect_open=True)) as running,
        httpx.AsyncClient(base_url=running.url, verify=client_context(server)) as http,
    ):
        assert (await http.get(INSPECT)).status_code == 200
        response = await http.post(FILTER, content=names_args(gpu_pod("p", 1), ["gpu-a"]))
        assert response.status_code == 403


async def test_https_without_a_client_ca_keeps_inspect_closed(
    js: JetStreamContext, tmp_path: Path
) -> None:
    server = make_pki(tmp_path / "server")
    async with (
        running_allocator(js, allocator_settings(tls=server.tls())) as running,
        httpx.AsyncClient(base_url=running.url, verify=client_context(server)) as http,
    ):
        assert (await http.get(INSPECT)).status_code == 403
