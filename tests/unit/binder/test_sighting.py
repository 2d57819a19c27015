"""The binder's last sighting of each pod (existence, node, phase), fed by its pod list and
watch; a GET's answer is kept too (against the API stand-in in the integration tests)."""

from __future__ import annotations

from typing import Any, cast

from gpushare.binder.decisions import Sighting
from gpushare.binder.sighting import PodSightings
from gpushare.core.pods import Pod, pod_from_dict
from gpushare.kube.client import KubeClient


def pod(uid: str, node: str | None = None, phase: str | None = None) -> Pod:
    manifest: dict[str, Any] = {"metadata": {"name": uid, "uid": uid}, "spec": {}}
    if node is not None:
        manifest["spec"]["nodeName"] = node
    if phase is not None:
        manifest["status"] = {"phase": phase}
    return pod_from_dict(manifest)


def index() -> PodSightings:
    return PodSightings(cast(KubeClient, None))  # these tests never read


def test_every_pod_is_seen_with_its_node_and_phase() -> None:
    seen = index()
    seen.remember(pod("a"))
    assert seen.get("a") == Sighting(present=True, node="", phase="Pending")
    seen.remember(pod("a", node="n1", phase="Running"))  # bound, then admitted
    assert seen.get("a") == Sighting(present=True, node="n1", phase="Running")
    assert seen.get("never") is None
    assert len(seen) == 1


def test_a_deleted_pod_is_forgotten_and_a_new_list_starts_over() -> None:
    seen = index()
    seen.remember(pod("a", node="n1"))
    seen.forget("a")
    assert seen.get("a") is None
    seen.remember(pod("gone", node="n1"))
    seen.replace([pod("kept", node="n1", phase="Succeeded")])
    assert seen.get("gone") is None
    assert seen.get("kept") == Sighting(present=True, node="n1", phase="Succeeded")
    assert seen.reads == 0
