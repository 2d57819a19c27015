"""The binder reads which resource names a pod asked: seed 003's annotations, PodBound's names."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js import JetStreamContext

from gpushare.binder.asking import AskedResources
from gpushare.binder.service import Binder
from gpushare.bus.log import AllocationLog
from gpushare.core.annotations import VKE_ASSUMED
from gpushare.core.events import BindFailed, PodBound, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import KubeError
from tests.fakes import FakeClock
from tests.integration.binder.test_binder import (
    CARD,
    NODE,
    create_pod,
    first_logged,
    pod_annotations,
    report_cards,
)
from tests.integration.kube.waiting import eventually

SECOND = Card(index=1, uuid="GPU-1", model="Tesla T4", memory_mib=15360)
MGPU = ("vke.volcengine.com/mgpu-core", "vke.volcengine.com/mgpu-memory")


def create_vke_pod(kube_api: KubeApiServer, name: str) -> PodRef:
    limits = {MGPU[0]: "100", MGPU[1]: "8000"}
    manifest: dict[str, Any] = {
        "metadata": {
            "name": name,
            "annotations": {"vke.volcengine.com/container-multiple-gpu": "2,1"},
        },
        "spec": {
            "containers": [
                {"name": "train", "image": "cuda", "resources": {"limits": limits}},
                {"name": "eval", "image": "cuda", "resources": {"limits": limits}},
            ]
        },
    }
    created = kube_api.create_pod(manifest, "ns")
    return PodRef(namespace="ns", name=name, uid=created["metadata"]["uid"])


def vke_reservation(clock: FakeClock, pod: PodRef) -> PodReserved:
    def share(container: str, card: Card, mib: int, core: int) -> ContainerShare:
        return ContainerShare(
            container=container,
            card_index=card.index,
            card_uuid=card.uuid,
            memory_mib=mib,
            core_percent=core,
        )

    shares = (
        share("train", SECOND, 4000, 50),
        share("train", CARD, 4000, 50),
        share("eval", CARD, 8000, 100),
    )
    return PodReserved(
        id=f"reserve-{pod.uid}",
        at=clock.now(),
        node=NODE,
        pod=pod,
        shares=shares,
        reserved_by="test",
    )


async def test_a_vke_pod_gets_seed_003s_annotations_and_its_names_travel_with_pod_bound(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await report_cards(js, clock, CARD, SECOND)
    pod = create_vke_pod(kube_api, "mgpu")
    await AllocationLog(js).append(vke_reservation(clock, pod))

    bound = await first_logged(js, PodBound)

    assert bound.resources == {"train": MGPU, "eval": MGPU}
    annotations = await pod_annotations(kube_api, pod)
    assert annotations[VKE_ASSUMED] == "true"
    for prefix in ("vke.volcengine.com/", "gpushare.io/"):
        assert annotations[f"{prefix}gpu-index-container-train"] == "1,0"
        assert annotations[f"{prefix}gpu-index-container-eval"] == "0"


async def test_an_aliyun_pod_gets_no_vke_keys(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await report_cards(js, clock)
    pod = create_pod(kube_api, "p1")
    shares = (ContainerShare(container="main", card_index=0, card_uuid=CARD.uuid, memory_mib=1024),)
    reserved = PodReserved(id="r1", at=clock.now(), node=NODE, pod=pod, shares=shares)
    await AllocationLog(js).append(reserved)

    bound = await first_logged(js, PodBound)

    assert bound.resources == {"main": ("aliyun.com/gpu-mem",)}
    annotations = await pod_annotations(kube_api, pod)
    assert annotations["gpushare.io/gpu-index-container-main"] == "0"
    assert not [key for key in annotations if key.startswith("vke.volcengine.com/")]


async def test_a_pod_not_seen_yet_is_read_once(kube_api: KubeApiServer, kube: KubeClient) -> None:
    asked = AskedResources(kube)
    pod = create_vke_pod(kube_api, "fresh")

    assert await asked.lookup(pod) == {"train": MGPU, "eval": MGPU}
    assert await asked.lookup(pod) == {"train": MGPU, "eval": MGPU}
    assert asked.reads == 1
    assert len(kube_api.requests("GET", "/pods/fresh$")) == 1


async def test_a_pod_gone_or_replaced_asked_nothing(
    kube_api: KubeApiServer, kube: KubeClient
) -> None:
    asked = AskedResources(kube)
    pod = create_vke_pod(kube_api, "p")
    assert await asked.lookup(PodRef(namespace="ns", name="p", uid="another")) == {}
    kube_api.delete("pods", "p", "ns")
    assert await AskedResources(kube).lookup(pod) == {}


async def test_a_failed_read_raises_for_the_binder_to_retry(
    kube_api: KubeApiServer, kube: KubeClient
) -> None:
    pod = create_vke_pod(kube_api, "p")
    kube_api.fail_next("GET", "/pods/p$", 503, "the API is down")
    with pytest.raises(KubeError):
        await AskedResources(kube).lookup(pod)


async def test_the_pod_list_and_watch_fill_the_index(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    pod = create_vke_pod(kube_api, "watched")
    await eventually(lambda: binder.asked.known(pod.uid) == {"train": MGPU, "eval": MGPU})
    kube_api.delete("pods", "watched", "ns")
    await eventually(lambda: binder.asked.known(pod.uid) is None)


async def test_a_pod_that_cannot_be_read_fails_the_bind_after_the_attempts(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    await report_cards(js, clock)
    pod = create_pod(kube_api, "unreadable")
    await eventually(lambda: binder.asked.known(pod.uid) is not None)
    binder.asked.forget(pod.uid)  # as if the watch had not shown it yet
    kube_api.fail_next("GET", "/pods/unreadable$", 503, "the API is down", times=-1)
    shares = (ContainerShare(container="main", card_index=0, card_uuid=CARD.uuid, memory_mib=1024),)
    await AllocationLog(js).append(
        PodReserved(id="r-unreadable", at=clock.now(), node=NODE, pod=pod, shares=shares)
    )

    failed = await first_logged(js, BindFailed)

    assert failed.reason == "cannot read the pod: the API is down"
    assert len(kube_api.requests("GET", "/pods/unreadable$")) == 3
    assert not kube_api.requests("POST", "/binding$")
