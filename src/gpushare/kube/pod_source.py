"""What bind reads from the Kubernetes API: the pod it is asked about, and the node.

kube-scheduler's bind call carries only names, a UID and a node, and anyone who can reach
the extender could send one. So bind believes neither its caller nor what filter was
told: it reads the pod (its GPU request and its constraints) and the node (labels,
taints) from the API at bind time. :class:`gpushare.core.ports.PodSource` is the seam the
bind flow depends on; :class:`KubernetesPodSource` is its adapter, reading both read-only
through :class:`~gpushare.kube.client.KubeClient` (its timeout, error mapping and
metrics). The binder stays the only writer.
"""

from __future__ import annotations

from gpushare.core.constraints import Node
from gpushare.core.pods import Pod
from gpushare.kube.client import KubeClient
from gpushare.kube.nodes import get_node
from gpushare.kube.pods import get_pod

__all__ = ["KubernetesPodSource"]


class KubernetesPodSource:
    """``GET /api/v1/namespaces/{namespace}/pods/{name}`` and ``GET /api/v1/nodes/{name}``
    (RBAC: ``get`` on pods and nodes), each in a worker thread."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str) -> KubernetesPodSource:
        """From a kubeconfig file, or the pod's service account for ``in-cluster``."""
        return cls(KubeClient.connect(kubeconfig))

    async def read_pod(self, namespace: str, name: str) -> Pod | None:
        return await get_pod(self._kube, namespace, name)

    async def read_node(self, name: str) -> Node | None:
        return await get_node(self._kube, name)
