"""A bound pod's annotations against the log's live allocation: what is patched back, and
what is recorded as a disagreement (a table on real folded events, and a property: one
repair always converges)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.annotations import (
    ALLOCATION,
    ASSIGNED,
    ASSUME_TIME,
    DEV,
    GPU_INDEX_CONTAINER,
    IDX,
    POD,
    RESERVATION,
    VKE_ASSUMED,
    VKE_GPU_INDEX_CONTAINER,
    binding_annotations,
    current_annotations,
)
from gpushare.core.events import AllocationCorrected, AnyEvent, ContainerAssigned, PodReserved
from gpushare.core.koordinator import DEVICE_ALLOCATED, device_allocated
from gpushare.core.pods import Pod, pod_from_dict
from gpushare.core.reconciliation import (
    AnnotationRepair,
    Context,
    adopted_id,
    annotation_repair,
    decide_pod,
    reconcile,
    reservation_names,
)
from gpushare.core.state import ClusterState
from tests.unit.core.factories import T0
from tests.unit.core.test_reconciliation import (
    BOUND_WITH,
    CARD0,
    CARD1,
    CONTEXT,
    LIVE,
    NODE,
    NODES,
    OURS,
    annotation,
    bound,
    folded,
    pod,
    reserved,
    share,
)

MAIN_KEY = f"{GPU_INDEX_CONTAINER}main"
SETTLING = msgspec.structs.replace(CONTEXT, settling=frozenset({"u1"}))


def moved_to(event: PodReserved, card: int) -> AllocationCorrected:
    """The node agent's correction: the kubelet gave the pod's containers ``card``."""
    shares = tuple(share(s.container, card, s.memory_mib) for s in event.shares)
    return AllocationCorrected(
        id=f"corrected-{event.id}-{card}",
        at=T0,
        node=event.node,
        pod=event.pod,
        reservation_id=event.id,
        shares=shares,
        reason="pod-resources",
    )


def assigned(event: PodReserved) -> ContainerAssigned:
    return ContainerAssigned(
        id=f"assigned-{event.id}",
        at=T0,
        node=event.node,
        pod=event.pod,
        reservation_id=event.id,
        container="main",
        card_uuids=(CARD0.uuid,),
    )


def without_inventory(*events: AnyEvent) -> ClusterState:
    state = ClusterState()
    for seq, event in enumerate(events, start=1):
        state.apply(event, seq)
    return state


ADOPTED = reserved("u1", adopted_id("u1", "r1"))
LEGACY = reserved("u1", adopted_id("u1", "idx0"))
OTHER = reserved(rid="r-other")
ON_CARD_1 = annotation("r1", share(card=1))
KOORDINATOR_ON_CARD_1 = device_allocated((share(card=1),), CARD1.memory_mib)


def decide(state: ClusterState, annotations: dict[str, str], context: Context = CONTEXT) -> Any:
    return decide_pod(state, pod(annotations=annotations), NODES, context)


@pytest.mark.parametrize(
    ("state", "annotations", "context"),
    [
        pytest.param(folded(LIVE, bound(LIVE)), BOUND_WITH, CONTEXT, id="as-bound"),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            {**BOUND_WITH, ASSUME_TIME: "1"},
            CONTEXT,
            id="another-assume-time",
        ),
        pytest.param(
            folded(ADOPTED, bound(ADOPTED)), BOUND_WITH, CONTEXT, id="adopted-names-the-original"
        ),
        pytest.param(
            without_inventory(LIVE, bound(LIVE)), BOUND_WITH, CONTEXT, id="card-size-unknown"
        ),
        pytest.param(
            without_inventory(LIVE, bound(LIVE)),
            {k: v for k, v in BOUND_WITH.items() if k != DEV},
            CONTEXT,
            id="card-size-unknown-not-written",
        ),
        pytest.param(folded(LIVE), {}, CONTEXT, id="bind-in-flight"),
    ],
)
def test_annotations_that_say_what_the_log_says_need_nothing(
    state: ClusterState, annotations: dict[str, str], context: Context
) -> None:
    assert decide(state, annotations, context) is None


@pytest.mark.parametrize(
    ("state", "annotations", "context", "patch", "words"),
    [
        pytest.param(
            folded(LIVE, bound(LIVE)),
            {**BOUND_WITH, IDX: "1"},
            CONTEXT,
            {IDX: "0"},
            "ALIYUN_COM_GPU_MEM_IDX='1', the log '0'",
            id="idx-edited",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            {**BOUND_WITH, MAIN_KEY: "1", POD: "99"},
            CONTEXT,
            {MAIN_KEY: "0", POD: "1024"},
            f"{MAIN_KEY}='1', the log '0'",
            id="container-key-and-total-edited",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            {**BOUND_WITH, ALLOCATION: ON_CARD_1},
            CONTEXT,
            {ALLOCATION: BOUND_WITH[ALLOCATION]},
            f"{ALLOCATION} names r1 on n (main: 1), the log r1 on n (main: 0)",
            id="allocation-names-another-card",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            {**BOUND_WITH, ALLOCATION: "{not json"},
            CONTEXT,
            {ALLOCATION: BOUND_WITH[ALLOCATION]},
            f"unreadable {ALLOCATION}",
            id="allocation-unreadable",
        ),
        pytest.param(
            folded(OTHER, bound(OTHER)),
            BOUND_WITH,
            CONTEXT,
            {
                RESERVATION: "r-other",
                ALLOCATION: annotation("r-other"),
            },
            f"{RESERVATION}='r1', the log 'r-other'",
            id="another-reservation",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE)),
            {**BOUND_WITH, ASSIGNED: "true"},
            CONTEXT,
            {ASSIGNED: "false"},
            f"{ASSIGNED}='true', the log: not every container assigned",
            id="assigned-too-early",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE), moved_to(LIVE, 1)),
            BOUND_WITH,
            CONTEXT,
            {
                IDX: "1",
                ALLOCATION: ON_CARD_1,
                DEVICE_ALLOCATED: KOORDINATOR_ON_CARD_1,
                MAIN_KEY: "1",
            },
            "ALIYUN_COM_GPU_MEM_IDX='0', the log '1'",
            id="moved-by-a-correction",
        ),
    ],
)
def test_a_disagreement_is_repaired_and_recorded(
    state: ClusterState,
    annotations: dict[str, str],
    context: Context,
    patch: dict[str, str],
    words: str,
) -> None:
    decided = decide(state, annotations, context)
    assert isinstance(decided, AnnotationRepair)
    assert decided.patch == patch
    found = decided.found
    assert found is not None
    assert (found.kind, found.node, found.pod, found.reservation_id) == (
        "annotation_mismatch",
        NODE,
        decided.pod,
        decided.reservation_id,
    )
    assert words in found.detail
    again = decide(state, annotations, context)
    assert again is not None
    assert again.found.id == found.id  # deterministic: a second binder's record deduplicates


@pytest.mark.parametrize(
    ("state", "annotations", "context", "patch"),
    [
        pytest.param(
            folded(LIVE, bound(LIVE)),
            OURS,
            CONTEXT,
            {k: v for k, v in BOUND_WITH.items() if k != ALLOCATION},
            id="an-older-binder-wrote-only-the-allocation",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE), assigned(LIVE)),
            BOUND_WITH,
            CONTEXT,
            {ASSIGNED: "true"},
            id="assigned-not-marked-yet",
        ),
        pytest.param(
            folded(LIVE, bound(LIVE), moved_to(LIVE, 1)),
            BOUND_WITH,
            SETTLING,
            {
                IDX: "1",
                ALLOCATION: ON_CARD_1,
                DEVICE_ALLOCATED: KOORDINATOR_ON_CARD_1,
                MAIN_KEY: "1",
            },
            id="moved-a-moment-ago",
        ),
        pytest.param(
            folded(LEGACY, bound(LEGACY)),
            {IDX: "0", POD: "1024"},
            CONTEXT,
            {
                DEV: str(CARD0.memory_mib),
                ASSUME_TIME: BOUND_WITH[ASSUME_TIME],
                ASSIGNED: "false",
                RESERVATION: LEGACY.id,
                ALLOCATION: annotation(LEGACY.id),
                DEVICE_ALLOCATED: device_allocated(LEGACY.shares, CARD0.memory_mib),
                MAIN_KEY: "0",
            },
            id="adopted-from-seed-000-keys",
        ),
    ],
)
def test_missing_or_lagging_keys_are_restored_without_a_record(
    state: ClusterState, annotations: dict[str, str], context: Context, patch: dict[str, str]
) -> None:
    decided = decide(state, annotations, context)
    assert isinstance(decided, AnnotationRepair)
    assert decided.patch == patch
    assert decided.found is None


def vke_pod(annotations: dict[str, str]) -> Pod:
    limits = {"vke.volcengine.com/mgpu-memory": "1024", "vke.volcengine.com/mgpu-core": "30"}
    return pod_from_dict(
        {
            "metadata": {
                "name": "pod-u1",
                "namespace": "ns",
                "uid": "u1",
                "annotations": annotations,
            },
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "main", "resources": {"limits": limits}}],
            },
            "status": {"phase": "Running"},
        }
    )


def test_a_vke_pod_gets_and_keeps_seed_003s_keys() -> None:
    state = folded(LIVE, bound(LIVE), moved_to(LIVE, 1))
    allocation = state.allocation("u1")
    assert allocation is not None
    missing = annotation_repair(vke_pod(BOUND_WITH), state.node(NODE), allocation, SETTLING)
    assert missing is not None
    assert missing.patch[f"{VKE_GPU_INDEX_CONTAINER}main"] == "1"
    assert missing.patch[VKE_ASSUMED] == "true"
    assert missing.found is None  # settling
    repaired = {**BOUND_WITH, **missing.patch}
    assert annotation_repair(vke_pod(repaired), state.node(NODE), allocation, CONTEXT) is None
    edited = {**repaired, f"{VKE_GPU_INDEX_CONTAINER}main": "0"}
    wrong = annotation_repair(vke_pod(edited), state.node(NODE), allocation, CONTEXT)
    assert wrong is not None
    assert wrong.patch == {f"{VKE_GPU_INDEX_CONTAINER}main": "1"}
    assert wrong.found is not None


def test_a_pass_collects_repairs_and_their_records() -> None:
    state = folded(LIVE, bound(LIVE), moved_to(LIVE, 1))
    corrections = reconcile(state, [pod(annotations=BOUND_WITH)], NODES, CONTEXT)
    (repair,) = corrections.repairs
    assert repair.found is not None
    assert corrections.events == (repair.found,)
    assert corrections.discrepancies == ()
    quiet = reconcile(state, [pod(annotations=BOUND_WITH)], NODES, SETTLING)
    assert quiet.events == ()
    assert [r.patch for r in quiet.repairs] == [repair.patch]


def test_an_adoption_may_name_the_reservation_it_came_from() -> None:
    adopted = folded(ADOPTED, bound(ADOPTED)).allocation("u1")
    live = folded(LIVE, bound(LIVE)).allocation("u1")
    assert adopted is not None
    assert live is not None
    assert reservation_names(adopted) == {ADOPTED.id, "r1"}
    assert reservation_names(live) == {"r1"}


# --- a property: whatever was done to the keys, one repair converges -----------------------

STATES = [
    folded(LIVE, bound(LIVE)),
    folded(LIVE, bound(LIVE), assigned(LIVE)),
    folded(LIVE, bound(LIVE), moved_to(LIVE, 1)),
    folded(LIVE, bound(LIVE), moved_to(LIVE, 1), moved_to(LIVE, 0)),
    folded(ADOPTED, bound(ADOPTED)),
]
KEYS = sorted(BOUND_WITH)
EDIT_VALUES = st.one_of(
    st.none(),
    st.sampled_from(["0", "1", "true", "false", "", "{", ON_CARD_1, "r-other", CARD1.uuid]),
    st.text(alphabet="01,{}tr", max_size=4),
)
"""What an edit does to a key: remove it (None), or set it to one of these."""


@given(
    state=st.sampled_from(STATES),
    edits=st.lists(st.tuples(st.sampled_from(KEYS), EDIT_VALUES), max_size=5),
    settling=st.booleans(),
)
def test_one_repair_makes_the_annotations_agree(
    state: ClusterState, edits: list[tuple[str, str | None]], settling: bool
) -> None:
    allocation = state.allocation("u1")
    assert allocation is not None
    annotations = current_annotations(allocation, NODE, CARD0.memory_mib, "MiB", mgpu=False)
    for key, value in edits:
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    context = SETTLING if settling else CONTEXT
    repair = annotation_repair(pod(annotations=annotations), state.node(NODE), allocation, context)
    if repair is None:
        return
    assert repair.patch  # a repair always writes something
    if settling or all(value is None for _, value in edits):
        assert repair.found is None  # only keys removed, or a move being rewritten
    merged = {**annotations, **repair.patch}
    assert annotation_repair(pod(annotations=merged), state.node(NODE), allocation, context) is None


def test_the_repair_uses_the_binding_builder() -> None:
    """What a repair writes for a fresh pod is exactly what the binding wrote."""
    state = folded(LIVE, bound(LIVE))
    allocation = state.allocation("u1")
    assert allocation is not None
    repair = annotation_repair(pod(annotations={}), state.node(NODE), allocation, CONTEXT)
    assert repair is not None
    assert repair.patch == binding_annotations(LIVE, CARD0.memory_mib, "MiB")
    assert repair.found is None
