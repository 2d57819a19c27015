"""The ``resource.k8s.io/v1`` objects gpushare reads and writes: our driver's
ResourceSlices (the binder publishes them) and ResourceClaims (the binder reads their
allocations; the node agent's kubelet plugin never calls the API).

Slices are written by server-side apply under one field manager, so every binder
replica writes the same fields and a repeat is a no-op for the apiserver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from gpushare.core.dra import DRIVER
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import NotFound
from gpushare.kube.informer import Informer

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
FIELD_MANAGER = "gpushare-binder"
OUR_SLICES = f"spec.driver={DRIVER}"

_object = msgspec.json.Decoder(dict[str, Any])


class _Slices(msgspec.Struct):
    items: list[dict[str, Any]] = []


_list = msgspec.json.Decoder(_Slices)


def decode_object(raw: msgspec.Raw) -> dict[str, Any]:
    return _object.decode(raw)


async def apply_slice(kube: KubeClient, body: dict[str, Any]) -> None:
    """Create or update the slice ``body`` names (server-side apply, forced: the binder
    owns every field of our driver's slices)."""
    name = body["metadata"]["name"]
    await kube.request(
        "patch_resource_slice",
        "PATCH",
        f"{SLICES}/{name}",
        msgspec.json.encode(body),
        params={"fieldManager": FIELD_MANAGER, "force": "true"},
        content_type="application/apply-patch+yaml",
    )


async def list_slices(kube: KubeClient) -> dict[str, dict[str, Any]]:
    """Our driver's slices, by name."""
    params = {"fieldSelector": OUR_SLICES}
    raw = await kube.request("list_resource_slice", "GET", SLICES, params=params)
    slices = _list.decode(raw.body).items
    return {str(body["metadata"]["name"]): body for body in slices}


async def delete_slice(kube: KubeClient, name: str) -> None:
    """Delete a slice; one already gone is not an error."""
    try:
        await kube.request("delete_resource_slice", "DELETE", f"{SLICES}/{name}")
    except NotFound:
        return


async def read_claim(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """One ResourceClaim; raises ``NotFound`` when it is gone."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    raw = await kube.request("read_namespaced_resource_claim", "GET", path)
    return _object.decode(raw.body)


def uid_key(body: dict[str, Any]) -> str:
    return str(body["metadata"]["uid"])


def namespaced_key(body: dict[str, Any]) -> str:
    return f"{body['metadata'].get('namespace', '')}/{body['metadata']['name']}"


def claim_informer(
    kube: KubeClient,
    on_change: Callable[[], None] | None = None,
    key: Callable[[dict[str, Any]], str] = uid_key,
) -> Informer[dict[str, Any]]:
    """Every ResourceClaim, by ``key`` (UID by default), kept in step (list and watch)."""
    return Informer(
        kube, "/apis/resource.k8s.io/v1/resourceclaims", decode_object, key, on_change=on_change
    )


def claim_template_informer(kube: KubeClient) -> Informer[dict[str, Any]]:
    """Every ResourceClaimTemplate, by ``namespace/name``, kept in step."""
    return Informer(
        kube, "/apis/resource.k8s.io/v1/resourceclaimtemplates", decode_object, namespaced_key
    )
