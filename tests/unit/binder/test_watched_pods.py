"""The pods a reconcile pass may correct, kept from the releaser's pod list and watch."""

from __future__ import annotations

from typing import Any

from gpushare.binder.watched_pods import WatchedPods
from gpushare.core.annotations import ALLOCATION, IDX, POD
from gpushare.core.pods import Pod, pod_from_dict
from tests.fakes import offline_follower
from tests.unit.node_agent.builders import card, inventory, reserve, share


def pod(uid: str, limits: dict[str, str] | None = None, **annotations: str) -> Pod:
    manifest: dict[str, Any] = {
        "metadata": {"name": uid, "uid": uid, "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits or {}}}]},
    }
    return pod_from_dict(manifest)


def test_pods_that_ask_a_gpu_carry_a_claim_or_hold_an_allocation_are_kept() -> None:
    follower = offline_follower([inventory(card(0)), reserve("held", share("c", card(0), 1024))])
    watched = WatchedPods(follower)
    watched.replace(
        [
            pod("asks", {"aliyun.com/gpu-mem": "1024"}),
            pod("annotated", **{ALLOCATION: "{}"}),
            pod("seed-000", **{IDX: "0", POD: "1024"}),
            pod("held"),
            pod("plain", {"cpu": "1"}),
            pod("half-a-claim", **{IDX: "0"}),
        ]
    )
    kept = sorted(p.metadata.uid for p in watched.pods())
    assert kept == ["annotated", "asks", "held", "seed-000"]
    assert watched.listed


def test_a_changed_pod_replaces_and_a_deleted_one_goes() -> None:
    watched = WatchedPods(offline_follower())
    assert not watched.listed
    watched.remember(pod("a", {"aliyun.com/gpu-mem": "1024"}))
    watched.remember(pod("b", **{ALLOCATION: "{}"}))
    watched.remember(pod("a", {"cpu": "1"}))  # no longer asks: nothing to correct
    watched.forget("b")
    assert (len(watched), watched.pods()) == (0, ())
