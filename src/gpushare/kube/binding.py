"""Binding a pod to its node, with the allocation annotations, in one API call.

``POST pods/{name}/binding`` with ``metadata.uid`` as a precondition sets the node and
merges the Binding's annotations into the pod atomically (protocols D.1). Its 201 answer
is a ``v1 Status``, which the official client cannot parse as the ``V1Binding`` its
OpenAPI spec promises, so the answer is read raw.

A 409 "already assigned" is a success when the pod sits on our node with our
reservation's annotation: that is our own earlier attempt, whose answer was lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import msgspec

from gpushare.core.annotations import RESERVATION
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import ConflictError, KubeError, PermanentError, TemporaryError
from gpushare.kube.pods import get_pod

log = logging.getLogger(__name__)

BindResult = Literal["bound", "refused", "temporary"]


@dataclass(frozen=True)
class BindOutcome:
    result: BindResult
    """``bound``: the pod is on the node with our annotations; ``refused``: it never will
    be (gone, replaced, bound elsewhere, invalid); ``temporary``: try again later."""
    message: str = ""
    status: int = 0
    """The HTTP status that decided it (0: no answer)."""

    @property
    def bound(self) -> bool:
        return self.result == "bound"


@dataclass(frozen=True)
class BindRequest:
    namespace: str
    name: str
    uid: str
    node: str
    annotations: Mapping[str, str]

    def body(self) -> bytes:
        """The Binding, as JSON: the node as its target, our annotations on the pod."""
        return _binding.encode(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "uid": self.uid,
                    "annotations": dict(self.annotations),
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
            }
        )

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/binding"


_binding = msgspec.json.Encoder()


async def bind_pod(
    kube: KubeClient,
    *,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    annotations: Mapping[str, str],
) -> BindOutcome:
    """Bind pod ``uid`` to ``node`` and write ``annotations``; never raises ``KubeError``."""
    request = BindRequest(namespace, name, uid, node, annotations)
    try:
        raw = await kube.request(
            "create_namespaced_pod_binding", "POST", request.path, request.body()
        )
    except ConflictError as error:
        return await _after_conflict(kube, request, error)
    except PermanentError as error:
        return BindOutcome("refused", error.message, error.status)
    except KubeError as error:
        return BindOutcome("temporary", error.message, error.status)
    return BindOutcome("bound", "", raw.status)


async def _after_conflict(
    kube: KubeClient, request: BindRequest, conflict: ConflictError
) -> BindOutcome:
    """Tell our own earlier bind (success) from anything else that holds the pod (refusal)."""
    try:
        pod = await get_pod(kube, request.namespace, request.name)
    except TemporaryError as error:
        return BindOutcome("temporary", f"{conflict.message}; re-reading: {error.message}")
    except KubeError as error:
        return BindOutcome("refused", f"{conflict.message}; re-reading: {error.message}", 409)
    ours = request.annotations.get(RESERVATION)
    if (
        pod is not None
        and pod.metadata.uid == request.uid
        and pod.spec.node_name == request.node
        and ours is not None
        and pod.annotations.get(RESERVATION) == ours
    ):
        log.info(
            "pod %s/%s was already bound to %s by reservation %s",
            request.namespace,
            request.name,
            request.node,
            ours,
        )
        return BindOutcome("bound", "already bound by this reservation", conflict.status)
    return BindOutcome("refused", conflict.message, conflict.status)
