"""A Kubernetes API stand-in per test, and clients for it."""

from __future__ import annotations

import pytest
from kubernetes.client import CoreV1Api

from gpushare.kube.client import KubeClient


@pytest.fixture
def core(kube: KubeClient) -> CoreV1Api:
    """The official client's CoreV1Api; call it through ``asyncio.to_thread``."""
    return kube.core
