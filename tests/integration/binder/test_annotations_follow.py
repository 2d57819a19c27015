"""Annotations follow the truth: when the log moves bound pods to other cards
(``AllocationCorrected``), the binder rewrites each pod's annotations in one patch; an
annotation edited to say something else is reported and repaired by reconciliation; a
move folded while no binder ran is rewritten when one starts. A real nats-server, the
Kubernetes API stand-in, a fake clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from nats.js import JetStreamContext

from gpushare.binder.service import Binder
from gpushare.bus.log import AllocationLog
from gpushare.core.annotations import (
    ALLOCATION,
    ASSIGNED,
    ASSUME_TIME,
    GPU_INDEX_CONTAINER,
    IDX,
    RESERVATION,
)
from gpushare.core.events import (
    AllocationCorrected,
    ContainerAssigned,
    CorrectedShares,
    DiscrepancyFound,
    PodReserved,
)
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from gpushare.kube.pods import patch_pod_annotations
from tests.fakes import FakeClock
from tests.integration.binder.conftest import FAST, StartBinder
from tests.integration.binder.test_binder import (
    CARD,
    NODE,
    bound_in_fold,
    create_pod,
    logged,
    pod_annotations,
    report_cards,
    wait_until_consumed,
)
from tests.integration.kube.waiting import eventually

CARD_B = Card(index=1, uuid="GPU-1", model="Tesla T4", memory_mib=15360)
CARDS = (CARD, CARD_B)
MAIN_KEY = f"{GPU_INDEX_CONTAINER}main"


def on(card: Card, mib: int = 1024) -> tuple[ContainerShare, ...]:
    return (
        ContainerShare(
            container="main", card_index=card.index, card_uuid=card.uuid, memory_mib=mib
        ),
    )


async def bind_on(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, name: str, card: Card
) -> tuple[PodRef, PodReserved]:
    """A pod reserved on ``card``, for the binder to bind."""
    pod = create_pod(kube_api, name)
    reserved = PodReserved(
        id=f"reserve-{pod.uid}",
        at=clock.now(),
        node=NODE,
        pod=pod,
        shares=on(card),
        reserved_by="t",
    )
    await AllocationLog(js).append(reserved)
    return pod, reserved


def swap(first: PodReserved, second: PodReserved, clock: FakeClock) -> AllocationCorrected:
    """The node agent's correction when the kubelet swapped the two pods' cards."""
    return AllocationCorrected(
        id=f"corrected-{first.id}",
        at=clock.now(),
        node=NODE,
        pod=first.pod,
        reservation_id=first.id,
        shares=on(CARD_B),
        reason="pod-resources: the kubelet swapped the cards",
        also=(CorrectedShares(pod=second.pod, reservation_id=second.id, shares=on(CARD)),),
    )


def patches(kube_api: KubeApiServer, pod: PodRef) -> int:
    return len(kube_api.requests("PATCH", f"/namespaces/{pod.namespace}/pods/{pod.name}$"))


def kube_api_annotations(kube_api: KubeApiServer, pod: PodRef) -> dict[str, str]:
    stored = kube_api.get("pods", pod.name, pod.namespace)
    return dict((stored or {}).get("metadata", {}).get("annotations") or {})


def names_card(annotations: Mapping[str, str], card: Card) -> bool:
    document = json.loads(annotations.get(ALLOCATION, "{}"))
    uuids = [share["card_uuid"] for share in document.get("containers", {}).get("main", [])]
    return (
        annotations.get(IDX) == str(card.index)
        and annotations.get(MAIN_KEY) == str(card.index)
        and uuids == [card.uuid]
    )


async def both_bound(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> tuple[tuple[PodRef, PodReserved], tuple[PodRef, PodReserved]]:
    await report_cards(js, clock, *CARDS)
    await binder.releaser.synced.wait()
    first = await bind_on(js, kube_api, clock, "p1", CARD)
    second = await bind_on(js, kube_api, clock, "p2", CARD_B)
    await eventually(lambda: bound_in_fold(binder, first[0]) and bound_in_fold(binder, second[0]))
    await wait_until_consumed(js)
    return first, second


async def test_a_swap_rewrites_both_pods_annotations_with_one_patch_each(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    (p1, r1), (p2, r2) = await both_bound(js, kube_api, clock, binder)
    before = {pod.name: await pod_annotations(kube_api, pod) for pod in (p1, p2)}
    assert names_card(before["p1"], CARD)
    assert names_card(before["p2"], CARD_B)
    assert (patches(kube_api, p1), patches(kube_api, p2)) == (0, 0)

    await AllocationLog(js).append(swap(r1, r2, clock))

    await eventually(lambda: names_card(kube_api_annotations(kube_api, p1), CARD_B))
    await eventually(lambda: names_card(kube_api_annotations(kube_api, p2), CARD))
    await wait_until_consumed(js)
    assert (patches(kube_api, p1), patches(kube_api, p2)) == (1, 1)
    for pod, reserved in ((p1, r1), (p2, r2)):
        after = await pod_annotations(kube_api, pod)
        unchanged = (ASSUME_TIME, ASSIGNED, RESERVATION)
        assert {k: after[k] for k in unchanged} == {k: before[pod.name][k] for k in unchanged}
        assert json.loads(after[ALLOCATION])["reservation"] == reserved.id
    # a reconcile pass finds the annotations agreeing with the log: nothing to do
    assert (await binder.reconciler.reconcile()).repaired == ()
    assert (patches(kube_api, p1), patches(kube_api, p2)) == (1, 1)
    assert not [e for e in await logged(js) if isinstance(e, DiscrepancyFound)]


async def test_a_moved_pod_already_assigned_stays_assigned(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, binder: Binder
) -> None:
    (p1, r1), (p2, r2) = await both_bound(js, kube_api, clock, binder)
    log = AllocationLog(js)
    for pod, reserved, card in ((p1, r1, CARD), (p2, r2, CARD_B)):
        await log.append(
            ContainerAssigned(
                id=f"assigned-{reserved.id}",
                at=clock.now(),
                node=NODE,
                pod=pod,
                reservation_id=reserved.id,
                container="main",
                card_uuids=(card.uuid,),
            )
        )
    for pod in (p1, p2):
        await eventually(lambda pod=pod: kube_api_annotations(kube_api, pod)[ASSIGNED] == "true")

    await log.append(swap(r1, r2, clock))

    await eventually(lambda: names_card(kube_api_annotations(kube_api, p1), CARD_B))
    await eventually(lambda: names_card(kube_api_annotations(kube_api, p2), CARD))
    assert kube_api_annotations(kube_api, p1)[ASSIGNED] == "true"
    assert kube_api_annotations(kube_api, p2)[ASSIGNED] == "true"


async def test_an_edited_annotation_is_reported_and_repaired_by_reconciliation(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    kube: KubeClient,
    clock: FakeClock,
    binder: Binder,
) -> None:
    (p1, r1), _ = await both_bound(js, kube_api, clock, binder)
    edit = {IDX: "1", MAIN_KEY: "1"}  # someone says the pod is on the other card
    await patch_pod_annotations(kube, p1.namespace, p1.name, edit, uid=p1.uid)

    first = await binder.reconciler.reconcile()

    (found,) = first.appended
    assert isinstance(found, DiscrepancyFound)
    assert (found.kind, found.pod, found.reservation_id) == ("annotation_mismatch", p1, r1.id)
    assert f"{IDX}='1', the log '0'" in found.detail
    assert first.repaired == (p1,)
    assert names_card(kube_api_annotations(kube_api, p1), CARD)
    second = await binder.reconciler.reconcile()
    assert (second.appended, second.repaired) == ((), ())
    records = [e for e in await logged(js) if isinstance(e, DiscrepancyFound)]
    assert [e.id for e in records] == [found.id]


async def test_a_move_folded_while_no_binder_ran_is_rewritten_when_one_starts(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    first_binder = await start_binder()
    (p1, r1), (p2, r2) = await both_bound(js, kube_api, clock, first_binder)
    await first_binder.stop()
    # its last pull request lives on in the server until it expires (the test's connection
    # stays open): a message delivered into it would wait out the ack wait
    await asyncio.sleep(3 * FAST.fetch_wait_s)

    await AllocationLog(js).append(swap(r1, r2, clock))
    await asyncio.sleep(0.3)
    assert names_card(kube_api_annotations(kube_api, p1), CARD)  # nobody rewrote it
    second_binder = await start_binder()

    await eventually(lambda: names_card(kube_api_annotations(kube_api, p1), CARD_B))
    await eventually(lambda: names_card(kube_api_annotations(kube_api, p2), CARD))
    await wait_until_consumed(js)
    assert second_binder.follower.state.node(NODE).pods[p1.uid].corrected
    # the rewrite was pending, not a disagreement: nothing recorded
    assert not [e for e in await logged(js) if isinstance(e, DiscrepancyFound)]
