"""``Device`` custom resources (``gpushare.io/v1alpha1``, cluster-scoped), through the
official client's ``CustomObjectsApi``.

:func:`write_device` creates the Device when it is missing, then writes its status
through the status subresource with the resourceVersion it last saw; a conflict reads
the object again and retries. A Device whose stored ``status.lastSeq`` is ahead of the
one being written was written by a replica further along the log and is left alone, so
replicas at different points never move a Device backwards.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kubernetes import client
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_attempt

from gpushare.core.device_resource import (
    API_VERSION,
    GROUP,
    KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
)
from gpushare.core.device_resource import VERSION as DEVICE_VERSION
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import ConflictError, NotFound

WRITE_ATTEMPTS = 5
"""Read-and-retry rounds after conflicts before the write is given up (for this round)."""


class _LostRace(Exception):
    """The Device changed or went between our read and our write: read it again."""


def _api(kube: KubeClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api_client)


def _object(answer: object) -> dict[str, Any]:
    """The client types custom objects as ``object``; they are JSON objects."""
    if not isinstance(answer, dict):
        raise TypeError(f"expected a JSON object from the API, got {type(answer).__name__}")
    return answer


def _seq(obj: dict[str, Any]) -> int:
    seq = (obj.get("status") or {}).get("lastSeq", 0)
    return seq if isinstance(seq, int) else 0


async def read_device(kube: KubeClient, name: str) -> dict[str, Any]:
    """The stored Device; :class:`NotFound` when missing (or the CRD is not installed)."""
    return _object(
        await kube.call(_api(kube).get_cluster_custom_object, GROUP, DEVICE_VERSION, PLURAL, name)
    )


async def _read_or_create(kube: KubeClient, body: dict[str, Any]) -> dict[str, Any]:
    name = body["metadata"]["name"]
    try:
        return await read_device(kube, name)
    except NotFound:
        pass
    try:
        created = await kube.call(
            _api(kube).create_cluster_custom_object, GROUP, DEVICE_VERSION, PLURAL, body
        )
    except ConflictError:  # another replica created it meanwhile
        return await read_device(kube, name)
    return _object(created)


async def _replace_status(kube: KubeClient, name: str, status: dict[str, Any], version: str) -> str:
    body = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "resourceVersion": version},
        "status": status,
    }
    stored = await kube.call(
        _api(kube).replace_cluster_custom_object_status, GROUP, DEVICE_VERSION, PLURAL, name, body
    )
    return str(_object(stored)["metadata"]["resourceVersion"])


async def write_device(kube: KubeClient, body: dict[str, Any], version: str | None = None) -> str:
    """Make the stored Device's status ``body["status"]``; return its resourceVersion.

    ``version`` is the resourceVersion this caller last wrote (skips the read when still
    current). Raises :class:`NotFound` when the Device CRD is not installed,
    :class:`ConflictError` after :data:`WRITE_ATTEMPTS` lost races.
    """
    name, status = body["metadata"]["name"], body["status"]
    if version is not None:
        try:
            return await _replace_status(kube, name, status, version)
        except (ConflictError, NotFound):
            pass  # changed or deleted since: read it again

    async def read_then_write() -> str:
        current = await _read_or_create(kube, body)
        stored_version = str(current["metadata"]["resourceVersion"])
        if _seq(current) > status.get("lastSeq", 0) or current.get("status") == status:
            return stored_version
        try:
            return await _replace_status(kube, name, status, stored_version)
        except (ConflictError, NotFound) as error:  # changed, or deleted since the read
            raise _LostRace from error

    retrying = AsyncRetrying(
        stop=stop_after_attempt(WRITE_ATTEMPTS), retry=retry_if_exception_type(_LostRace)
    )
    try:
        return await retrying(read_then_write)
    except RetryError:
        message = f"device {name}: gave up after {WRITE_ATTEMPTS} conflicting writes"
        raise ConflictError(message, 409) from None


async def list_devices(kube: KubeClient) -> list[str]:
    """The names of the Devices gpushare manages."""
    listed = await kube.call(
        _api(kube).list_cluster_custom_object,
        GROUP,
        DEVICE_VERSION,
        PLURAL,
        label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
    )
    return [item["metadata"]["name"] for item in _object(listed).get("items") or []]


async def delete_device(kube: KubeClient, name: str) -> None:
    """Delete the Device; one already gone is fine."""
    with contextlib.suppress(NotFound):
        await kube.call(
            _api(kube).delete_cluster_custom_object, GROUP, DEVICE_VERSION, PLURAL, name
        )
