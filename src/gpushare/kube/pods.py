"""Reading pods and patching their annotations.

Pods are read from the raw JSON straight into :class:`gpushare.core.pods.Pod` (msgspec),
which skips the client's pydantic models: a list of thousands of pods decodes in
milliseconds, and the core reads exactly the same shape the extender receives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import msgspec

from gpushare.core.pods import Pod
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import ConflictError, NotFound, PermanentError
from gpushare.kube.listing import LIST_PAGE, list_raw

MERGE_PATCH = "application/merge-patch+json"
UNPROCESSABLE = 422


class ListMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    resource_version: str = ""


class PodList(msgspec.Struct, frozen=True, kw_only=True):
    """A consistent snapshot: watch from ``metadata.resource_version`` to follow it."""

    metadata: ListMeta = ListMeta()
    items: tuple[Pod, ...] = ()

    @property
    def resource_version(self) -> str:
        return self.metadata.resource_version


_pod = msgspec.json.Decoder(Pod)
_json = msgspec.json.Encoder()


async def list_pods(
    kube: KubeClient,
    *,
    field_selector: str | None = None,
    label_selector: str | None = None,
    page: int = LIST_PAGE,
) -> PodList:
    """Every pod in every namespace that matches the selectors: one snapshot, listed
    ``page`` at a time and each page decoded on its own (:mod:`gpushare.kube.listing`)."""
    items: list[Pod] = []
    version = ""
    pages = list_raw(kube, "/api/v1/pods", field_selector, label_selector=label_selector, page=page)
    async with contextlib.aclosing(pages):
        async for listed_at, listed in pages:
            version = listed_at
            items.extend(_pod.decode(raw) for raw in listed)
    return PodList(metadata=ListMeta(resource_version=version), items=tuple(items))


async def get_pod(kube: KubeClient, namespace: str, name: str) -> Pod | None:
    """The pod as the API has it now, or None if it does not exist."""
    try:
        raw = await kube.request(
            "read_namespaced_pod", "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
    except NotFound:
        return None
    return _pod.decode(raw.body)


async def merge_patch(kube: KubeClient, name: str, path: str, body: object) -> None:
    """A JSON merge patch of ``path``, on the event loop (aiohttp), as bindings are sent;
    ``name`` is the client method it stands for (:meth:`KubeClient.request`). Through the
    official client, each was a worker thread, its argument validation and urllib3."""
    await kube.request(name, "PATCH", path, _json.encode(body), content_type=MERGE_PATCH)


async def patch_pod_annotations(
    kube: KubeClient,
    namespace: str,
    name: str,
    annotations: Mapping[str, str | None],
    *,
    uid: str | None = None,
) -> None:
    """Merge-patch annotations (a None value removes the key); other keys are untouched.

    A JSON merge patch, not the client's default strategic merge: both behave the same on
    a string map, but merge patch is what every API server (and CRD) accepts. With ``uid``
    the patch only applies to that very pod (a same-named successor: :class:`ConflictError`).
    """
    metadata: dict[str, object] = {"annotations": dict(annotations)}
    if uid:
        metadata["uid"] = uid
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    try:
        await merge_patch(kube, "patch_namespaced_pod", path, {"metadata": metadata})
    except PermanentError as error:
        # kube-apiserver refuses another uid as an immutable field (422): for us, the pod
        # was replaced meanwhile, which is a conflict
        if uid and error.status == UNPROCESSABLE and "metadata.uid" in error.message:
            raise ConflictError(error.message, error.status) from error
        raise
