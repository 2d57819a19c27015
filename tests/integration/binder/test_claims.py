"""The binder records kube-scheduler's DRA claims in the log: real nats-server, and the API
stand-in serving ``resource.k8s.io/v1`` ResourceClaims from a CRD of the same shape, with
its ``status`` subresource (the stand-in has no DRA of its own; the binder reads no more
than the claims' JSON)."""

from __future__ import annotations

from typing import Any

import msgspec
from nats.js import JetStreamContext

from gpushare.binder.service import Binder
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.core.dra import DRIVER
from gpushare.core.events import ClaimAllocated, InventoryReported
from gpushare.core.model import Card, PodRef
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from tests.fakes import FakeClock
from tests.integration.binder.conftest import StartBinder
from tests.integration.kube.waiting import eventually

NODE = "gpu-d"
CARD = Card(index=0, uuid="GPU-d-0", model="Tesla T4", memory_mib=15360)
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
POD_A = PodRef(namespace="ns", name="a", uid="uid-a")
POD_B = PodRef(namespace="ns", name="b", uid="uid-b")
CLAIMS_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "resourceclaims.resource.k8s.io"},
    "spec": {
        "group": "resource.k8s.io",
        "scope": "Namespaced",
        "names": {"plural": "resourceclaims", "singular": "resourceclaim", "kind": "ResourceClaim"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
"""``resource.k8s.io/v1`` ResourceClaims, any content, status written through ``/status``."""


def shared_claim(*pods: PodRef, resource_version: str = "") -> dict[str, Any]:
    """Claim ``ns/shared``: 4 GiB of GPU0 on NODE, as kube-scheduler allocates it, reserved
    for ``pods``."""
    metadata: dict[str, Any] = {"namespace": "ns", "name": "shared"}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    node_term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "consumedCapacity": {"memory": "4Gi"},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": [node_term]},
            },
            "reservedFor": [{"resource": "pods", "name": p.name, "uid": p.uid} for p in pods],
        },
    }


async def reserve_for(kube: KubeClient, *pods: PodRef) -> None:
    """Write the claim's status, allocated and reserved for ``pods``, as kube-scheduler does
    when it allocates the claim and when another pod joins it."""
    raw = await kube.request("read_namespaced_resource_claim", "GET", f"{CLAIMS}/shared")
    version = msgspec.json.decode(raw.body)["metadata"]["resourceVersion"]
    body = msgspec.json.encode(shared_claim(*pods, resource_version=version))
    path = f"{CLAIMS}/shared/status"
    await kube.request("replace_namespaced_resource_claim_status", "PUT", path, body)


def held_pods(binder: Binder) -> tuple[PodRef, ...] | None:
    """The pods the binder's fold holds the claim reserved for; ``None`` before it holds it."""
    return next((held.pods for held in binder.follower.state.node(NODE).claims.values()), None)


async def claim_records(js: JetStreamContext) -> list[ClaimAllocated]:
    return [
        event
        async for _, event in AllocationLog(js).read_node(NODE, 0)
        if isinstance(event, ClaimAllocated)
    ]


async def test_every_pod_joining_and_leaving_a_shared_claim_is_in_the_log(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    kube: KubeClient,
    clock: FakeClock,
    start_binder: StartBinder,
) -> None:
    kube_api.install_crd(CLAIMS_CRD)
    kube_api.create_namespace("ns")
    await publish_inventory(
        js,
        InventoryReported(
            id="inventory-d",
            at=clock.now(),
            node=NODE,
            cards=(CARD,),
            source="fixture",
            heartbeat_seconds=5,
            front_door="dra",
        ),
    )
    binder = await start_binder(dra=True)
    created = msgspec.json.encode(shared_claim())  # the status is dropped, as on create
    await kube.request("create_namespaced_resource_claim", "POST", CLAIMS, created)
    await reserve_for(kube, POD_A)  # allocated for its first pod
    await eventually(lambda: held_pods(binder) == (POD_A,))

    await reserve_for(kube, POD_A, POD_B)  # a second pod shares the claim
    await eventually(lambda: held_pods(binder) == (POD_A, POD_B))
    assert binder.follower.state.node(NODE).used_mib[CARD.uuid] == 4096  # counted once

    await reserve_for(kube, POD_B)  # the first one is gone
    await eventually(lambda: held_pods(binder) == (POD_B,))
    records = await claim_records(js)
    assert [(event.pods, event.left) for event in records] == [
        ((POD_A,), ()),
        ((POD_A, POD_B), ()),
        ((POD_B,), (POD_A,)),
    ]
    assert len({event.id for event in records}) == 3
    assert binder.follower.state.node(NODE).used_mib[CARD.uuid] == 4096
