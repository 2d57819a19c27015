"""The settled-system invariants, case by case: what each check sees and what it says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from gpushare.core.annotations import binding_annotations
from gpushare.core.events import PodBound, PodReserved
from gpushare.core.invariants import (
    PodFacts,
    Violation,
    check_cluster,
    compare_inspections,
    orphaned_allocations,
    oversubscribed_cards,
    pod_facts,
    unallocated_pods,
)
from gpushare.core.model import ContainerShare
from gpushare.core.state import ClusterState
from tests.unit.core.factories import T0, V100, inventory, make_card, pod_ref

CARDS = {node: (make_card(0, node=node), make_card(1, node=node)) for node in ("n", "m")}


def reservation(
    uid: str, mib: int, *, node: str = "n", card: int = 0, core: int = 0, uuid: str = ""
) -> PodReserved:
    target = CARDS[node][card]
    share = ContainerShare(
        container="main",
        card_index=card,
        card_uuid=uuid or target.uuid,
        memory_mib=mib,
        core_percent=core,
    )
    return PodReserved(id=f"r-{uid}-{node}", at=T0, node=node, pod=pod_ref(uid), shares=(share,))


def bound(event: PodReserved) -> PodBound:
    return PodBound(
        id=f"{event.id}.bound", at=T0, node=event.node, pod=event.pod, reservation_id=event.id
    )


def folded(*events: PodReserved | PodBound) -> ClusterState:
    state = ClusterState()
    for node, cards in CARDS.items():
        state.apply(inventory(node, cards))
    for seq, event in enumerate(events, start=1):
        state.apply(event, seq)
    return state


def facts(event: PodReserved, *, phase: str = "Running", node: str | None = "") -> PodFacts:
    """The API's view of ``event``'s pod bound as the binder binds it (``node=None``: unbound)."""
    annotations = binding_annotations(event, V100, "MiB") if node is not None else {}
    return PodFacts(
        namespace=event.pod.namespace,
        name=event.pod.name,
        uid=event.pod.uid,
        node=None if node is None else (node or event.node),
        phase=phase,
        annotations=annotations,
    )


A = reservation("a", 10000)
B = reservation("b", 8000)
A_ON_M = reservation("a", 4000, node="m")


def checks(found: list[Violation]) -> list[str]:
    return [violation.check for violation in found]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param([A, reservation("b", 6276)], [], id="exactly full"),
        pytest.param([A, B], ["oversubscribed"], id="memory over"),
        pytest.param([A, reservation("b", 8000, card=1)], [], id="two cards"),
        pytest.param(
            [reservation("a", 100, core=60), reservation("b", 100, core=50)],
            ["oversubscribed"],
            id="compute over",
        ),
        pytest.param([reservation("a", 100, uuid="GPU-gone")], ["unknown card"], id="unknown"),
    ],
)
def test_oversubscribed_cards(events: list[PodReserved], expected: list[str]) -> None:
    assert checks(oversubscribed_cards(folded(*events))) == expected


def test_an_oversubscribed_card_names_its_holders() -> None:
    (violation,) = oversubscribed_cards(folded(A, B))
    assert violation.where == f"n card 0 ({CARDS['n'][0].uuid})"
    assert "18000 MiB held of 16276 MiB" in violation.detail
    assert "default/name-a(10000)" in violation.detail
    assert "default/name-b(8000)" in violation.detail


def without_annotations(pod: PodFacts) -> PodFacts:
    return msgspec.structs.replace(pod, annotations={})


def annotated_as(other: PodReserved) -> Callable[[PodFacts], PodFacts]:
    def change(pod: PodFacts) -> PodFacts:
        return msgspec.structs.replace(pod, annotations=binding_annotations(other, V100, "MiB"))

    return change


def same(pod: PodFacts) -> PodFacts:
    return pod


@pytest.mark.parametrize(
    ("events", "pod", "change", "expected"),
    [
        pytest.param([A, bound(A)], facts(A), same, "", id="backed"),
        pytest.param([A], facts(A, phase="Pending"), same, "", id="bound, not yet admitted"),
        pytest.param([], facts(A, node=None, phase="Pending"), same, "", id="not bound"),
        pytest.param([], facts(A, phase="Failed"), same, "", id="finished"),
        pytest.param(
            [A], facts(A), without_annotations, "without gpushare's allocation", id="no annotation"
        ),
        pytest.param([], facts(A), same, "the log holds nothing", id="released while running"),
        pytest.param(
            [reservation("a", 10000, card=1)],
            facts(A),
            same,
            "annotated cards",
            id="other card",
        ),
        pytest.param(
            [A], facts(A), annotated_as(reservation("a", 10000, node="m")), "annotated with r-a-m",
            id="other reservation",
        ),
    ],
)  # fmt: skip
def test_unallocated_pods(
    events: list[PodReserved | PodBound],
    pod: PodFacts,
    change: Callable[[PodFacts], PodFacts],
    expected: str,
) -> None:
    found = unallocated_pods(folded(*events), [change(pod)])
    if not expected:
        assert found == []
    else:
        (violation,) = found
        assert violation.check == "unallocated"
        assert violation.where == "pod default/name-a on n"
        assert expected in violation.detail


def test_pod_facts_read_a_pod_as_the_api_serves_it() -> None:
    limits = {"limits": {"aliyun.com/gpu-mem": "1024"}}
    pod = {
        "metadata": {"namespace": "ml", "name": "p", "uid": "u", "annotations": {"k": "v"}},
        "spec": {"nodeName": "n", "containers": [{"name": "main", "resources": limits}]},
        "status": {"phase": "Running"},
    }
    assert pod_facts(pod) == PodFacts(
        namespace="ml", name="p", uid="u", node="n", phase="Running", annotations={"k": "v"}
    )
    plain = {"metadata": {"name": "q", "uid": "v"}, "spec": {"containers": [{"name": "c"}]}}
    assert pod_facts(plain) == PodFacts(
        namespace="default", name="q", uid="v", phase="Pending", asks_gpu=False
    )


def test_a_pod_that_asks_no_gpu_needs_no_allocation() -> None:
    pod = msgspec.structs.replace(facts(A), annotations={}, asks_gpu=False)
    assert unallocated_pods(folded(), [pod]) == []


@pytest.mark.parametrize(
    ("events", "pods", "expected"),
    [
        pytest.param([A, bound(A)], [facts(A)], [], id="held by its running pod"),
        pytest.param([A], [facts(A, node=None, phase="Pending")], [], id="reserved, unbound"),
        pytest.param([A, bound(A)], [], ["orphaned"], id="pod gone"),
        pytest.param([A, bound(A)], [facts(A, phase="Succeeded")], ["orphaned"], id="finished"),
        pytest.param([A, bound(A)], [facts(A, node="m")], ["orphaned"], id="bound elsewhere"),
        pytest.param(
            [A, bound(A), A_ON_M], [facts(A)], ["duplicated"], id="reserved on a second node"
        ),
    ],
)
def test_orphaned_allocations(
    events: list[PodReserved | PodBound], pods: list[PodFacts], expected: list[str]
) -> None:
    assert checks(orphaned_allocations(folded(*events), pods)) == expected


def test_orphans_say_how_much_memory_is_stuck() -> None:
    (violation,) = orphaned_allocations(folded(A), [])
    assert violation.where == "default/name-a (a) on n"
    assert violation.detail == "10000 MiB held for a pod the API no longer has"


def test_check_cluster_runs_every_check() -> None:
    state = folded(A, bound(A), B)
    found = check_cluster(state, [facts(B, node=None)])
    assert sorted(checks(found)) == ["orphaned", "oversubscribed"]
    assert all(str(violation).startswith(violation.check + ": ") for violation in found)


def inspection(used: int = 10000, **node: Any) -> dict[str, Any]:
    pod = {"uid": "a", "mib": used, "reservation_id": "r-a-n", "state": "bound"}
    card = {
        "index": 0,
        "uuid": "GPU-n-0",
        "total_mib": V100,
        "used_mib": used,
        "healthy": True,
        "containers": 1,
        "pods": [pod],
    }
    base = {"name": "n", "devs": [card], "last_seq": 7, "used_mib": used, "pod_count": 1}
    return {"nodes": [{**base, **node}]}


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        pytest.param(inspection(), [], id="same"),
        pytest.param(inspection(inventory_at="later", stale=True), [], id="inventory timing"),
        pytest.param(
            inspection(last_seq=6),
            ["n last_seq: allocator-1 6, replay 7"],
            id="behind",
        ),
        pytest.param(
            inspection(used=4096),
            [
                "n card 0 pods: allocator-1 [('a', 4096, 'r-a-n', 'bound')], "
                "replay [('a', 10000, 'r-a-n', 'bound')]",
                "n card 0 used_mib: allocator-1 4096, replay 10000",
                "n used_mib: allocator-1 4096, replay 10000",
            ],
            id="other usage",
        ),
        pytest.param(
            {"nodes": []},
            [f"n {key}: allocator-1 None, replay {value!r}" for key, value in sorted({
                "card 0 containers": 1, "card 0 healthy": True,
                "card 0 pods": [("a", 10000, "r-a-n", "bound")], "card 0 total_mib": V100,
                "card 0 used_mib": 10000, "card 0 uuid": "GPU-n-0", "last_seq": 7,
                "pod_count": 1, "used_mib": 10000,
            }.items())],
            id="node missing",
        ),
    ],
)  # fmt: skip
def test_compare_inspections(live: dict[str, Any], expected: list[str]) -> None:
    found = compare_inspections(live, inspection(), name="allocator-1")
    assert all(violation.check == "diverged" for violation in found)
    assert [f"{violation.where}: {violation.detail}" for violation in found] == expected
