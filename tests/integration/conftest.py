"""Shared by the integration tests: a Kubernetes API stand-in per test, and a client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient


@pytest.fixture
async def kube_api() -> AsyncIterator[KubeApiServer]:
    server = await KubeApiServer().start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def kubeconfig(kube_api: KubeApiServer, tmp_path: Path) -> Path:
    return kube_api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def kube(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = KubeClient.connect(kubeconfig)
    try:
        yield client
    finally:
        await client.aclose()
