"""The Kubernetes API contract (``tests.contracts.kube_api``) against the stand-in; the same
body runs against the real kube-apiserver in ``tests/k8s/test_kube_api_contract.py``."""

from __future__ import annotations

from tests.contracts.kube_api import KubeApiContract


class TestStandIn(KubeApiContract):
    """``kube``: tests/integration/kube/conftest.py (a stand-in per test)."""
