"""Events are checked against the subject they came on before anything folds them."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.bus.provenance import RefusedOrigin, decode_from, origin_of, refusal
from gpushare.bus.subjects import (
    allocation_subject,
    inventory_subject,
    writer_of,
)
from gpushare.core.events import (
    AllocationCorrected,
    AnyEvent,
    BindFailed,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
    encode_event,
)
from gpushare.core.model import ContainerShare
from gpushare.core.reconciliation import ADOPTED_POLICY
from gpushare.core.state import Folded, NodeState, Unfolded, fold_events
from tests.unit.core.event_streams import NODES, history
from tests.unit.core.factories import inventory, make_card, pod_ref

AT = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
A, B = "gpu-a", "gpu.b"
POD = pod_ref("victim")
SHARE = (ContainerShare(container="c0", card_index=0, card_uuid="GPU-b-0", memory_mib=12000),)


def about(node: str) -> dict[str, AnyEvent]:
    """One event of every type about ``node``, as its rightful writer would write it."""
    common = {"at": AT, "node": node}
    held = (ForeignHold(card_uuid="GPU-b-0", resource="nvidia.com/gpu", pods=("o/p",)),)
    return {
        "PodReserved": PodReserved(id="r", pod=POD, shares=SHARE, **common),
        "adoption": PodReserved(id="r2", pod=POD, shares=SHARE, policy=ADOPTED_POLICY, **common),
        "PodBound": PodBound(id="b", pod=POD, reservation_id="r", **common),
        "BindFailed": BindFailed(id="f", pod=POD, reservation_id="r", reason="x", **common),
        "PodReleased": PodReleased(id="x", pod=POD, reservation_id="r", reason="deleted", **common),
        "ContainerAssigned": ContainerAssigned(
            id="a", pod=POD, reservation_id="r", container="c0", card_uuids=("GPU-b-0",), **common
        ),
        "AllocationCorrected": AllocationCorrected(
            id="c", pod=POD, reservation_id="r", shares=SHARE, reason="kubelet", **common
        ),
        "ForeignCardsHeld": ForeignCardsHeld(id="h", holds=held, **common),
        "agent finding": DiscrepancyFound(
            id="d", kind="card_mismatch", detail="x", reporter=f"node-agent/{node}", **common
        ),
        "binder finding": DiscrepancyFound(
            id="d2", kind="annotation_mismatch", detail="x", reporter="reconciler", **common
        ),
        "InventoryReported": inventory(node, [make_card(0, node=node)]),
    }


def node_a_subjects() -> tuple[str, ...]:
    """Everything node A's NATS user may publish on (:func:`gpushare.bus.permissions.node`)."""
    return inventory_subject(A), allocation_subject(A, "agent")


ATTACKS = list(about(B))


@pytest.mark.parametrize("subject", node_a_subjects())
@pytest.mark.parametrize("name", ATTACKS)
def test_node_a_cannot_write_anything_about_node_b(subject: str, name: str) -> None:
    event = about(B)[name]

    with pytest.raises(RefusedOrigin) as refused:
        decode_from(subject, encode_event(event))

    assert "gpu.b" in str(refused.value)


RIGHTFUL = {
    "allocator": {"PodReserved"},
    "binder": {
        "adoption",
        "PodBound",
        "BindFailed",
        "PodReleased",
        "ContainerAssigned",
        "binder finding",
    },
    "agent": {"ContainerAssigned", "AllocationCorrected", "ForeignCardsHeld", "agent finding"},
}


@pytest.mark.parametrize("writer", sorted(RIGHTFUL))
@pytest.mark.parametrize("name", ATTACKS)
def test_each_writer_role_writes_only_its_own_event_types(writer: str, name: str) -> None:
    event = about(A)[name]
    subject = allocation_subject(A, writer)

    reason = refusal(subject, event)

    assert (reason is None) == (name in RIGHTFUL[writer]), reason


def test_every_event_the_services_write_passes_on_the_subject_they_write_it_to() -> None:
    for name, event in about(B).items():
        if isinstance(event, InventoryReported):
            subject = inventory_subject(B)
        else:
            subject = allocation_subject(B, writer_of(event))
        assert decode_from(subject, encode_event(event)) == event, name


def test_only_the_inventory_subject_carries_inventory() -> None:
    event = about(A)["InventoryReported"]

    assert refusal(inventory_subject(A), event) is None
    assert refusal(allocation_subject(A, "agent"), event) is not None
    assert refusal(inventory_subject(A), about(A)["ContainerAssigned"]) is not None


def test_a_node_agent_finding_must_name_its_own_node_as_reporter() -> None:
    finding = msgspec.structs.replace(about(A)["agent finding"], reporter=f"node-agent/{B}")

    assert "reported by" in str(refusal(allocation_subject(A, "agent"), finding))


@pytest.mark.parametrize(
    ("subject", "origin"),
    [
        ("gpushare.alloc.gpu-a.agent", (A, "agent")),
        ("gpushare.alloc.gpu~b.binder", (B, "binder")),
        ("gpushare.inventory.gpu~b", (B, "reporter")),
        ("gpushare.alloc.gpu-a", None),  # the legacy subject names no writer
        ("gpushare.alloc.gpu-a.admin", None),
        ("gpushare.alloc.gpu-a.agent.extra", None),
        ("gpushare.decisions.default.p", None),
    ],
)
def test_origin_of_subjects(subject: str, origin: tuple[str, str] | None) -> None:
    found = origin_of(subject)

    assert (found and (found.node, found.writer)) == origin


def test_a_refusal_is_a_validation_error_like_any_bad_body() -> None:
    """Every reader already steps over a body that does not validate."""
    assert issubclass(RefusedOrigin, msgspec.ValidationError)


def test_the_fold_steps_over_an_unfolded_message_moving_only_last_seq() -> None:
    base = fold_events([(0, about(A)["InventoryReported"]), (1, about(A)["PodReserved"])])

    after = fold_events([(2, Unfolded(node=A))], base)

    assert after.node(A).last_seq == 2
    assert after.node(A).pods == base.node(A).pods
    assert after.node(A).cards == base.node(A).cards


def _as_published(pairs: list[tuple[int, AnyEvent]]) -> list[tuple[int, str, bytes]]:
    """Each event on the subject its rightful writer publishes it to, legit sequences even."""
    published: list[tuple[int, str, bytes]] = []
    seen: set[int] = set()
    for seq, event in pairs:
        if seq in seen:
            continue  # a redelivery in the history: a stream holds each sequence once
        seen.add(seq)
        if isinstance(event, InventoryReported):
            subject = inventory_subject(event.node)
        else:
            subject = allocation_subject(event.node, writer_of(event))
        published.append((2 * seq, subject, encode_event(event)))
    return published


def _fold(messages: list[tuple[int, str, bytes]]) -> dict[str, NodeState]:
    pairs: list[tuple[int, Folded]] = []
    for seq, subject, data in sorted(messages, key=lambda message: message[0]):
        try:
            pairs.append((seq, decode_from(subject, data)))
        except msgspec.MsgspecError:
            origin = origin_of(subject)
            if origin is not None and not subject.startswith("gpushare.inventory."):
                pairs.append((seq, Unfolded(node=origin.node)))
    state = fold_events(pairs)
    return dict(state.nodes.items())


@settings(max_examples=60, deadline=None)
@given(
    legit_seed=st.integers(0, 2**32),
    attack_seed=st.integers(0, 2**32),
    length=st.integers(0, 40),
    attacks=st.integers(0, 40),
)
def test_no_sequence_published_by_one_nodes_user_changes_another_nodes_state(
    legit_seed: int, attack_seed: int, length: int, attacks: int
) -> None:
    """Node ``a``'s user publishes whatever it likes (any event, about any node, garbage)
    on the subjects it may publish to, between the legitimate writers' messages: nodes
    ``b`` and ``c`` fold exactly as without it."""
    legit = _as_published(history(random.Random(legit_seed), length))
    rng = random.Random(attack_seed)
    forged = [event for _, event in history(rng, attacks)]
    ours = (inventory_subject("a"), allocation_subject("a", "agent"))
    attack = [
        (2 * i + 1, rng.choice(ours), encode_event(event) if rng.random() < 0.9 else b"\x00{")
        for i, event in enumerate(forged)
    ]

    without, with_attack = _fold(legit), _fold(legit + attack)

    for node in NODES:
        if node != "a":
            assert with_attack.get(node) == without.get(node)
