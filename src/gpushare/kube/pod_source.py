"""What bind reads from the Kubernetes API: the pod it is asked about, and the node.

kube-scheduler's bind call carries only names, a UID and a node, and anyone who can reach
the extender could send one. So bind believes neither its caller nor what filter was
told: it reads the pod (its GPU request and its constraints) and the node (labels,
taints) from the API. :class:`gpushare.core.ports.PodSource` is the seam the bind flow
depends on; :class:`KubernetesPodSource` is its adapter, read-only (the binder stays the
only writer).

It reads as kube-scheduler does, from informers (:mod:`gpushare.kube.informer`): every
node, and the pods not yet on a node (``spec.nodeName=``, kube-scheduler's own selector
for the pods it schedules), listed once and watched. A GET per bind cost the allocator a
worker-thread call through the official client and kube-apiserver two requests per pod.
A read the caches cannot answer (not synced yet, or a pod they have not seen, or not
under the UID asked for: a pod deleted and created again under its name) is a GET
through :class:`~gpushare.kube.client.KubeClient` (its timeout, error mapping, metrics),
as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import msgspec

from gpushare.core.constraints import Node
from gpushare.core.dra_claims import TEMPLATE
from gpushare.core.pods import Pod
from gpushare.kube.client import KubeClient
from gpushare.kube.dra_objects import claim_informer, claim_template_informer, namespaced_key
from gpushare.kube.informer import Informer
from gpushare.kube.nodes import get_node
from gpushare.kube.pods import get_pod

__all__ = ["UNSCHEDULED", "KubernetesPodSource"]

UNSCHEDULED = "spec.nodeName="
"""The pods bind can be asked about: those not on a node yet."""

_pod = msgspec.json.Decoder(Pod)
_node = msgspec.json.Decoder(Node)


def _pod_key(pod: Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def _node_key(node: Node) -> str:
    return node.name


class KubernetesPodSource:
    """Nodes and unscheduled pods from informers once :meth:`start` has run (RBAC:
    ``list`` and ``watch`` on pods and nodes), else ``GET`` of the pod and of the node
    (``get`` on both)."""

    def __init__(self, kube: KubeClient, *, dra: bool = False) -> None:
        self._kube = kube
        self.claims: Informer[dict[str, Any]] | None = None
        self.templates: Informer[dict[str, Any]] | None = None
        if dra:  # the DRA claims of pods the extender scores (``claim_spec``)
            self.claims = claim_informer(kube, key=namespaced_key)
            self.templates = claim_template_informer(kube)
        self.pods: Informer[Pod] = Informer(
            kube, "/api/v1/pods", _pod.decode, _pod_key, field_selector=UNSCHEDULED
        )
        self.nodes: Informer[Node] = Informer(kube, "/api/v1/nodes", _node.decode, _node_key)
        self._tasks: list[asyncio.Task[None]] = []
        self.cached_reads = 0
        """Reads the informers answered (the rest were GETs)."""

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str, *, dra: bool = False) -> KubernetesPodSource:
        """From a kubeconfig file, or the pod's service account for ``in-cluster``."""
        return cls(KubeClient.connect(kubeconfig), dra=dra)

    def start(self) -> None:
        """Run both informers on this event loop until :meth:`stop`."""
        if not self._tasks:
            informers: list[tuple[str, Informer[Any]]] = [
                ("pods", self.pods),
                ("nodes", self.nodes),
            ]
            if self.claims is not None and self.templates is not None:
                informers += [("claims", self.claims), ("claim templates", self.templates)]
            self._tasks = [
                asyncio.create_task(informer.run(), name=f"informer {name}")
                for name, informer in informers
            ]

    async def stop(self) -> None:
        """Stop the informers and close the API connections."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._kube.aclose()

    async def read_pod(self, namespace: str, name: str, uid: str = "") -> Pod | None:
        cached = self.pods.get(f"{namespace}/{name}")
        if cached is not None and (not uid or cached.metadata.uid == uid):
            self.cached_reads += 1
            return cached
        return await get_pod(self._kube, namespace, name)

    async def read_node(self, name: str) -> Node | None:
        cached = self.nodes.get(name)
        if cached is not None:
            self.cached_reads += 1
            return cached
        return await get_node(self._kube, name)

    def claim_spec(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A ``ResourceClaim``'s spec or a ``ResourceClaimTemplate``'s claim spec, from the
        informers (``None`` when not seen, or not reading DRA objects):
        :data:`gpushare.core.dra_claims.ClaimSpecs`."""
        informer = self.templates if kind == TEMPLATE else self.claims
        found = informer.get(f"{namespace}/{name}") if informer is not None else None
        if found is None:
            return None
        spec = found.get("spec") or {}
        return (spec.get("spec") or {}) if kind == TEMPLATE else spec
