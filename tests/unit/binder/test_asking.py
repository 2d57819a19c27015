"""The binder's index of what each GPU pod asked, fed by the pod list and watch."""

from __future__ import annotations

from typing import Any, cast

from gpushare.binder.asking import AskedResources
from gpushare.core.model import PodRef
from gpushare.core.pods import Pod, pod_from_dict
from gpushare.kube.client import KubeClient


def pod(uid: str, limits: dict[str, str]) -> Pod:
    manifest: dict[str, Any] = {
        "metadata": {"name": uid, "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    return pod_from_dict(manifest)


def index() -> AskedResources:
    return AskedResources(cast(KubeClient, None))  # never reads: every pod is known


def test_only_pods_asking_a_gpu_are_kept() -> None:
    asked = index()
    asked.remember(pod("a", {"aliyun.com/gpu-mem": "1024"}))
    asked.remember(pod("b", {"cpu": "1"}))
    assert asked.known("a") == {"c": ("aliyun.com/gpu-mem",)}
    assert asked.known("b") is None
    assert len(asked) == 1


def test_a_changed_pod_replaces_and_a_deleted_one_goes() -> None:
    asked = index()
    asked.remember(pod("a", {"aliyun.com/gpu-mem": "1024"}))
    asked.remember(pod("a", {"cpu": "1"}))
    assert asked.known("a") is None
    asked.remember(pod("b", {"vke.volcengine.com/mgpu-core": "50"}))
    asked.forget("b")
    assert len(asked) == 0


def test_a_new_list_starts_over() -> None:
    asked = index()
    asked.remember(pod("gone", {"aliyun.com/gpu-mem": "1"}))
    asked.replace([pod("kept", {"gpushare.io/gpu": "50"})])
    assert asked.known("gone") is None
    assert asked.known("kept") == {"c": ("gpushare.io/gpu",)}


async def test_a_known_pod_is_never_read() -> None:
    asked = index()
    asked.remember(pod("a", {"gpushare.io/gpu-core": "30"}))
    assert await asked.lookup(PodRef(namespace="default", name="a", uid="a")) == {
        "c": ("gpushare.io/gpu-core",)
    }
    assert asked.reads == 0
