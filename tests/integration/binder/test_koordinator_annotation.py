"""Koordinator's ``scheduling.koordinator.sh/device-allocated`` on the pods the binder binds,
beside the Aliyun annotations, and rewritten with them when the log moves a pod. A real
nats-server, the Kubernetes API stand-in, a fake clock."""

from __future__ import annotations

import json
from typing import Any

from nats.js import JetStreamContext

from gpushare.binder.service import Binder
from gpushare.bus.log import AllocationLog
from gpushare.core.annotations import IDX
from gpushare.core.events import AllocationCorrected, CorrectedShares, PodReserved
from gpushare.core.koordinator import DEVICE_ALLOCATED
from gpushare.core.model import Card, ContainerShare
from gpushare.embedded.kube_api import KubeApiServer
from tests.fakes import FakeClock
from tests.integration.binder.test_annotations_follow import (
    CARD_B,
    both_bound,
    kube_api_annotations,
)
from tests.integration.binder.test_binder import (
    CARD,
    NODE,
    bound_pod,
    logged,
    pod_annotations,
    report_cards,
)
from tests.integration.kube.waiting import eventually


def koordinator(annotations: dict[str, str]) -> Any:
    return json.loads(annotations[DEVICE_ALLOCATED])


def moved(reserved: PodReserved, card: Card) -> CorrectedShares:
    share = ContainerShare(
        container="main", card_index=card.index, card_uuid=card.uuid, memory_mib=1024
    )
    return CorrectedShares(pod=reserved.pod, reservation_id=reserved.id, shares=(share,))


def swap(first: PodReserved, second: PodReserved, clock: FakeClock) -> AllocationCorrected:
    """The node agent's correction when the kubelet swapped the two pods' cards."""
    there, back = moved(first, CARD_B), moved(second, CARD)
    return AllocationCorrected(
        id=f"corrected-{first.id}",
        at=clock.now(),
        node=NODE,
        pod=first.pod,
        reservation_id=first.id,
        shares=there.shares,
        reason="pod-resources: the kubelet swapped the cards",
        also=(back,),
    )


async def test_a_bound_pod_carries_koordinators_device_allocated(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await report_cards(js, clock, CARD)  # a T4 of 15360 MiB
    pod, _ = await bound_pod(js, kube_api, clock, containers={"main": 1024, "side": 3072})
    annotations = await pod_annotations(kube_api, pod)
    assert annotations[IDX] == "0"
    # pod-level, as Koordinator writes it: both containers' 4096 MiB on minor 0, 26 % of it
    assert koordinator(annotations) == {
        "gpu": [
            {
                "minor": 0,
                "resources": {
                    "koordinator.sh/gpu-memory": "4Gi",
                    "koordinator.sh/gpu-memory-ratio": "26",
                },
            }
        ]
    }


async def test_a_move_rewrites_koordinators_minors_too(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    (p1, r1), (p2, r2) = await both_bound(js, kube_api, clock, binder)
    before = koordinator(await pod_annotations(kube_api, p1))
    assert [entry["minor"] for entry in before["gpu"]] == [CARD.index]

    await AllocationLog(js).append(swap(r1, r2, clock))

    def minors(pod: Any) -> list[int]:
        annotations = kube_api_annotations(kube_api, pod)
        return [entry["minor"] for entry in koordinator(annotations)["gpu"]]

    await eventually(lambda: minors(p1) == [CARD_B.index] and minors(p2) == [CARD.index])
    after = koordinator(kube_api_annotations(kube_api, p1))
    assert after["gpu"][0]["resources"] == {
        "koordinator.sh/gpu-memory": "1Gi",
        "koordinator.sh/gpu-memory-ratio": "6",
    }
    assert (await binder.reconciler.reconcile()).repaired == ()
    assert not [e for e in await logged(js) if type(e).__name__ == "DiscrepancyFound"]
