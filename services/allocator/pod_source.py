"""Reading a pod that filter never showed us (another replica filtered it, or we restarted).

:class:`PodSource` is the seam the bind flow depends on; :class:`KubernetesPodSource`
reads the pod read-only with the official client. The binder stays the only writer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from gpushare.core.pods import Pod, pod_from_dict

log = logging.getLogger(__name__)

IN_CLUSTER = "in-cluster"
"""``--kubeconfig in-cluster`` uses the pod's service account instead of a file."""

NOT_FOUND = 404


class PodSource(Protocol):
    async def read_pod(self, namespace: str, name: str) -> Pod | None:
        """The pod as the API has it now, or ``None`` if it does not exist."""
        ...


class KubernetesPodSource:
    """``GET /api/v1/namespaces/{namespace}/pods/{name}`` through the ``kubernetes`` client.

    The client is synchronous, so each read runs in a worker thread.
    """

    def __init__(self, core_api: Any) -> None:
        self._api = core_api

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str) -> KubernetesPodSource:
        from kubernetes import client, config

        if kubeconfig == IN_CLUSTER:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            api_client = client.ApiClient()
        else:
            api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig
            )
        return cls(client.CoreV1Api(api_client))

    async def read_pod(self, namespace: str, name: str) -> Pod | None:
        from kubernetes.client.exceptions import ApiException

        try:
            pod = await asyncio.to_thread(self._api.read_namespaced_pod, name, namespace)
        except ApiException as error:
            if error.status == NOT_FOUND:
                return None
            raise
        data: dict[str, Any] = self._api.api_client.sanitize_for_serialization(pod)
        return pod_from_dict(data)
