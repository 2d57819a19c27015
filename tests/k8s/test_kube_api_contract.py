"""The Kubernetes API contract (``tests.contracts.kube_api``) against the real kube-apiserver
(one control plane for the module); the same body runs against the stand-in in
``tests/integration/kube/test_kube_api_contract.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpushare.embedded.k8s_cluster import ControlPlane
from gpushare.kube.client import KubeClient
from tests.contracts.kube_api import KubeApiContract


@pytest.fixture
async def kube(k8s_clean: ControlPlane) -> AsyncIterator[KubeClient]:
    client = KubeClient.connect(k8s_clean.kubeconfig)
    try:
        yield client
    finally:
        await client.aclose()


class TestRealApiServer(KubeApiContract):
    pass
