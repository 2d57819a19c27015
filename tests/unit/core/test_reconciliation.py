"""Reconciling the log with the Kubernetes API: which pods are adopted, which allocations
released, which disagreements recorded (a table per decision, on real folded events)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from gpushare.core.annotations import (
    ALLOCATION,
    IDX,
    POD,
    AllocationAnnotation,
    binding_annotations,
)
from gpushare.core.events import (
    AnyEvent,
    ContainerAssigned,
    DiscrepancyFound,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.model import ContainerShare, PodRef
from gpushare.core.pods import Pod, pod_from_dict
from gpushare.core.reconciliation import (
    ADOPTED_POLICY,
    RECONCILER,
    Adoption,
    Context,
    adopted_id,
    decide_pod,
    read_claim,
    reconcile,
)
from gpushare.core.state import ClusterState
from tests.unit.core.factories import T0, inventory, make_card

NODE = "n"
CARD0, CARD1 = make_card(0, node=NODE), make_card(1, node=NODE)
NOW = T0 + timedelta(seconds=20)
"""Two heartbeats after the inventory: the node's reporter is alive."""
LATER = T0 + timedelta(seconds=300)
"""The reporter silent for long: a node the API lacks is gone."""
CONTEXT = Context(now=NOW, bind_timeout=timedelta(seconds=120))
NODES = frozenset({NODE})


def share(container: str = "main", card: int = 0, mib: int = 1024) -> ContainerShare:
    on = (CARD0, CARD1)[card]
    return ContainerShare(
        container=container, card_index=on.index, card_uuid=on.uuid, memory_mib=mib
    )


def annotation(reservation: str, *shares: ContainerShare, node: str = NODE) -> str:
    containers: dict[str, list[ContainerShare]] = {}
    for one in shares or (share(),):
        containers.setdefault(one.container, []).append(one)
    document = AllocationAnnotation(
        node=node, reservation=reservation, unit="MiB", containers=containers
    )
    return msgspec.json.encode(document).decode()


def pod(
    uid: str = "u1",
    annotations: dict[str, str] | None = None,
    *,
    node: str | None = NODE,
    phase: str = "Running",
    containers: Sequence[tuple[str, int]] = (("main", 1024),),
    deleting: bool = False,
) -> Pod:
    spec: dict[str, Any] = {
        "containers": [
            {"name": name, "resources": {"limits": {"aliyun.com/gpu-mem": str(mib)}}}
            for name, mib in containers
        ]
    }
    if node is not None:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": f"pod-{uid}", "namespace": "ns", "uid": uid}
    meta["annotations"] = annotations or {}
    meta["creationTimestamp"] = "2026-01-01T11:00:00Z"
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:00:10Z"
    return pod_from_dict({"metadata": meta, "spec": spec, "status": {"phase": phase}})


def ref(uid: str = "u1") -> PodRef:
    return PodRef(namespace="ns", name=f"pod-{uid}", uid=uid)


def reserved(
    uid: str = "u1", rid: str = "r1", node: str = NODE, *shares: ContainerShare
) -> PodReserved:
    return PodReserved(id=rid, at=T0, node=node, pod=ref(uid), shares=shares or (share(),))


def bound(event: PodReserved) -> PodBound:
    return PodBound(
        id=f"{event.id}.bound", at=T0, node=event.node, pod=event.pod, reservation_id=event.id
    )


def folded(*events: AnyEvent) -> ClusterState:
    state = ClusterState()
    state.apply(inventory(NODE, [CARD0, CARD1]))
    for seq, event in enumerate(events, start=1):
        state.apply(event, seq)
    return state


LIVE = reserved()
OURS = {ALLOCATION: annotation("r1")}
BOUND_WITH = binding_annotations(LIVE, CARD0.memory_mib, "MiB")
"""Every key the binding wrote for ``LIVE``."""


# --- adoption -----------------------------------------------------------------------------


def test_an_annotated_pod_missing_from_the_log_is_adopted() -> None:
    decided = decide_pod(folded(), pod(annotations=OURS), NODES, CONTEXT)
    assert isinstance(decided, Adoption)
    rid = adopted_id("u1", "r1")
    assert decided.reserved == PodReserved(
        id=rid,
        at=NOW,
        node=NODE,
        pod=ref(),
        shares=(share(),),
        pod_created_at=decided.reserved.pod_created_at,
        policy=ADOPTED_POLICY,
        reserved_by=RECONCILER,
    )
    assert decided.reserved.pod_created_at is not None
    assert decided.bound.id == f"{rid}.bound"
    assert (decided.bound.reservation_id, dict(decided.bound.resources)) == (
        rid,
        {"main": ("aliyun.com/gpu-mem",)},
    )
    assert [(a.container, a.card_uuids) for a in decided.assigned] == [("main", (CARD0.uuid,))]
    state = folded()
    for seq, event in enumerate(decided.events, start=1):
        state.apply(event, seq)
    assert state.node(NODE).used_mib[CARD0.uuid] == 1024
    allocation = state.allocation("u1")
    assert allocation is not None
    assert allocation.bound
    assert allocation.fully_assigned


def test_a_pending_pod_is_adopted_bound_but_waits_for_its_allocate() -> None:
    decided = decide_pod(folded(), pod(annotations=OURS, phase="Pending"), NODES, CONTEXT)
    assert isinstance(decided, Adoption)
    assert decided.assigned == ()


def test_ids_are_deterministic_so_a_second_reconciler_deduplicates() -> None:
    first = decide_pod(folded(), pod(annotations=OURS), NODES, CONTEXT)
    later = Context(now=NOW + timedelta(seconds=5), bind_timeout=timedelta(seconds=120))
    second = decide_pod(folded(), pod(annotations=OURS), NODES, later)
    assert isinstance(first, Adoption)
    assert isinstance(second, Adoption)
    assert [e.id for e in first.events] == [e.id for e in second.events]


@pytest.mark.parametrize(
    ("containers", "annotations", "expected"),
    [
        pytest.param(
            (("main", 2048),), {IDX: "1", POD: "2048"}, [("main", 1, 2048)], id="one-container"
        ),
        pytest.param(
            (("a", 1000), ("b", 500)),
            {IDX: "0", POD: "1500"},
            [("a", 0, 1000), ("b", 0, 500)],
            id="each-container-keeps-its-ask",
        ),
        pytest.param(
            (("main", 0),), {IDX: "1", POD: "3000"}, [("main", 1, 3000)], id="total-on-the-first"
        ),
    ],
)
def test_seed_000_keys_alone_are_adopted_with_what_they_say(
    containers: Sequence[tuple[str, int]],
    annotations: dict[str, str],
    expected: list[tuple[str, int, int]],
) -> None:
    decided = decide_pod(
        folded(), pod(annotations=annotations, containers=containers), NODES, CONTEXT
    )
    assert isinstance(decided, Adoption)
    shares = decided.reserved.shares
    assert [(s.container, s.card_index, s.memory_mib) for s in shares] == expected
    assert decided.reserved.id == adopted_id("u1", f"idx{annotations[IDX]}")


def test_seed_000_keys_wait_for_the_nodes_inventory() -> None:
    legacy = pod(annotations={IDX: "0", POD: "1024"})
    assert decide_pod(ClusterState(), legacy, NODES, CONTEXT) is None


@pytest.mark.parametrize(
    "candidate",
    [
        pytest.param(pod(annotations=OURS, node=None), id="not-bound"),
        pytest.param(pod(annotations=OURS, phase="Succeeded"), id="finished"),
        pytest.param(pod(annotations=OURS, deleting=True), id="being-deleted"),
        pytest.param(pod(annotations={"other": "x"}), id="not-ours"),
        pytest.param(pod(annotations={IDX: "0"}), id="idx-without-pod"),
    ],
)
def test_pods_that_are_not_adopted(candidate: Pod) -> None:
    assert decide_pod(folded(), candidate, NODES, CONTEXT) is None


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(folded(LIVE, bound(LIVE)), id="its-own-reservation"),
        pytest.param(folded(LIVE), id="bind-in-flight"),
        pytest.param(
            folded(
                adopted := reserved("u1", adopted_id("u1", "r1")),
                bound(adopted),
            ),
            id="already-adopted",
        ),
    ],
)
def test_a_pod_the_log_holds_as_annotated_needs_nothing(state: ClusterState) -> None:
    assert decide_pod(state, pod(annotations=BOUND_WITH), NODES, CONTEXT) is None


# --- discrepancies ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "candidate", "words"),
    [
        pytest.param(
            folded(moved := reserved(node="m"), bound(moved)),
            pod(annotations=OURS),
            "live allocation is r1 on m",
            id="another-node-in-the-log",
        ),
        pytest.param(
            folded(),
            pod(annotations={ALLOCATION: annotation("r1", node="m")}),
            "bound to n, annotated for m",
            id="annotated-for-another-node",
        ),
        pytest.param(
            folded(), pod(annotations={ALLOCATION: "{not json"}), "unreadable", id="not-json"
        ),
        pytest.param(
            folded(),
            pod(annotations={ALLOCATION: '{"node": "n"}'}),
            "missing required field",
            id="missing-fields",
        ),
        pytest.param(
            folded(),
            pod(
                annotations={
                    ALLOCATION: annotation("r1").replace('"memory_mib":1024', '"memory_mib":"x"')
                }
            ),
            "Expected `int`",
            id="wrong-type",
        ),
        pytest.param(
            folded(), pod(annotations={IDX: "zero", POD: "1"}), "unreadable", id="bad-idx"
        ),
        pytest.param(folded(), pod(annotations={IDX: "7", POD: "1"}), "no such card", id="no-card"),
    ],
)
def test_disagreements_are_recorded_not_guessed(
    state: ClusterState, candidate: Pod, words: str
) -> None:
    decided = decide_pod(state, candidate, NODES, CONTEXT)
    assert isinstance(decided, DiscrepancyFound)
    assert decided.kind == "annotation_mismatch"
    assert words in decided.detail
    assert (decided.node, decided.pod, decided.reporter) == (NODE, ref(), RECONCILER)
    again = decide_pod(state, candidate, NODES, CONTEXT)
    assert again is not None
    assert again.id == decided.id


def test_a_malformed_annotation_is_read_as_its_parse_error() -> None:
    claim = read_claim(pod(annotations={ALLOCATION: "[1, 2"}))
    assert isinstance(claim, str)
    assert claim.startswith(f"unreadable {ALLOCATION}")


# --- releases -----------------------------------------------------------------------------


def releases(
    state: ClusterState, pods: Sequence[Pod], nodes: frozenset[str] | None, now: Any
) -> list[tuple[str, str, str]]:
    context = Context(now=now, bind_timeout=timedelta(seconds=120))
    found = reconcile(state, pods, nodes, context).releases
    assert all(isinstance(event, PodReleased) for event in found)
    return [(event.reservation_id, event.reason, event.id) for event in found]


UNBOUND = reserved("u2", "r2")
RUNNING = pod(annotations=OURS)


@pytest.mark.parametrize(
    ("state", "pods", "nodes", "now", "expected"),
    [
        pytest.param(
            folded(LIVE, bound(LIVE)), [], NODES, NOW, [("r1", "reconciled")], id="pod-gone"
        ),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            [pod("other", annotations=OURS)],
            NODES,
            NOW,
            [("r1", "reconciled")],
            id="same-name-other-uid",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            [pod(annotations=OURS, phase="Failed")],
            NODES,
            NOW,
            [("r1", "terminated")],
            id="pod-finished",
        ),
        pytest.param(folded(UNBOUND), [], NODES, NOW, [], id="unbound-and-young"),
        pytest.param(
            folded(UNBOUND),
            [],
            NODES,
            T0 + timedelta(seconds=121),
            [("r2", "reconciled")],
            id="unbound-and-old",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            [RUNNING],
            frozenset(),
            LATER,
            [("r1", "node_removed")],
            id="node-removed",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            [RUNNING],
            frozenset(),
            NOW,
            [],
            id="node-missing-but-reporting",
        ),
        pytest.param(folded(LIVE, bound(LIVE)), [RUNNING], None, LATER, [], id="node-list-unknown"),
        pytest.param(folded(LIVE, bound(LIVE)), [RUNNING], NODES, LATER, [], id="all-well"),
    ],
)
def test_allocations_released(
    state: ClusterState,
    pods: list[Pod],
    nodes: frozenset[str] | None,
    now: Any,
    expected: list[tuple[str, str]],
) -> None:
    found = releases(state, pods, nodes, now)
    assert [(rid, reason) for rid, reason, _ in found] == expected
    assert all(event_id == f"{rid}.released" for rid, _, event_id in found)


def test_a_pod_on_a_removed_node_is_not_adopted_again() -> None:
    state = folded()
    context = Context(now=LATER, bind_timeout=timedelta(seconds=120))
    assert decide_pod(state, RUNNING, frozenset(), context) is None


# --- a whole pass -------------------------------------------------------------------------


def test_a_pass_then_its_fold_needs_nothing_more() -> None:
    gone = reserved("gone", "r-gone")
    state = folded(gone, bound(gone))
    pods = [pod(annotations=OURS), pod("u3", annotations={ALLOCATION: "{"})]
    first = reconcile(state, pods, NODES, CONTEXT)
    kinds = [type(event) for event in first.events]
    assert kinds == [PodReserved, PodBound, ContainerAssigned, PodReleased, DiscrepancyFound]
    seq = max(node.last_seq for node in state.nodes.values())
    for event in first.events:
        seq += 1
        state.apply(event, seq)
    second = reconcile(state, pods, NODES, CONTEXT)
    assert (second.adoptions, second.releases) == ((), ())
    assert [d.id for d in second.discrepancies] == [d.id for d in first.discrepancies]
    # the adopted pod's annotations gain what the binding would have written, quietly
    (repair,) = second.repairs
    assert repair.found is None
    patched = pod(annotations={**OURS, **repair.patch})
    third = reconcile(state, [patched, pods[1]], NODES, CONTEXT)
    assert third.repairs == ()


def test_inventory_alone_is_not_a_node_in_the_api() -> None:
    state = ClusterState()
    state.apply(
        InventoryReported(
            id="i", at=T0, node="x", cards=(CARD0,), source="fixture", heartbeat_seconds=1
        )
    )
    assert reconcile(state, [], frozenset(), CONTEXT).events == ()
