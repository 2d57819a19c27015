"""Allocation subjects per node and writer role (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpushare.bus.subjects import (
    Writer,
    allocation_subject,
    node_allocations,
    node_of_allocation,
    writer_of,
)
from gpushare.core.events import (
    AllocationCorrected,
    AllocationEvent,
    BindFailed,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.model import PodRef
from gpushare.core.reconciliation import ADOPTED_POLICY
from gpushare.node_agent.correcting import reporter_of

AT = datetime(2026, 1, 1, tzinfo=UTC)
POD = PodRef(namespace="ns", name="p", uid="u")
N = "gpu.a"


@pytest.mark.parametrize(
    ("event", "writer"),
    [
        (PodReserved(id="e", at=AT, node=N, pod=POD, shares=()), "allocator"),
        (PodReserved(id="e", at=AT, node=N, pod=POD, shares=(), policy=ADOPTED_POLICY), "binder"),
        (PodBound(id="e", at=AT, node=N, pod=POD, reservation_id="r"), "binder"),
        (BindFailed(id="e", at=AT, node=N, pod=POD, reservation_id="r", reason="x"), "binder"),
        (
            PodReleased(id="e", at=AT, node=N, pod=POD, reservation_id="r", reason="deleted"),
            "binder",
        ),
        (
            ContainerAssigned(
                id="e", at=AT, node=N, pod=POD, reservation_id="r", container="c", card_uuids=()
            ),
            "agent",
        ),
        (
            AllocationCorrected(
                id="e", at=AT, node=N, pod=POD, reservation_id="r", shares=(), reason="x"
            ),
            "agent",
        ),
        (ForeignCardsHeld(id="e", at=AT, node=N, holds=()), "agent"),
        (
            DiscrepancyFound(
                id="e", at=AT, node=N, kind="card_mismatch", detail="d", reporter="node-agent/gpu.a"
            ),
            "agent",
        ),
        (
            DiscrepancyFound(
                id="e", at=AT, node=N, kind="annotation_mismatch", detail="d", reporter="reconciler"
            ),
            "binder",
        ),
    ],
)
def test_each_event_has_its_writer(event: AllocationEvent, writer: Writer) -> None:
    assert writer_of(event) == writer


def test_a_node_subject_names_node_and_writer_and_reads_back() -> None:
    subject = allocation_subject("gpu.a", "agent")
    assert subject == "gpushare.alloc.gpu~a.agent"
    assert node_of_allocation(subject) == "gpu.a"
    assert node_allocations("gpu.a") == "gpushare.alloc.gpu~a.*"


def test_the_node_agents_findings_are_appended_as_the_agent() -> None:
    found = DiscrepancyFound(
        id="e", at=AT, node=N, kind="foreign_overlap", detail="d", reporter=reporter_of(N)
    )
    assert writer_of(found) == "agent"
