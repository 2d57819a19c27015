"""The streams' message size limits hold every legitimate message with room to spare."""

from __future__ import annotations

from datetime import UTC, datetime

from gpushare.bus.streams import (
    ALLOCATION_MAX_MSG_BYTES,
    INVENTORY_MAX_MSG_BYTES,
    REJECTED_MAX_MSG_BYTES,
    allocation_config,
    inventory_config,
    rejected_config,
)
from gpushare.core.device_ids import compact_ids
from gpushare.core.events import (
    AllocationCorrected,
    ContainerAssigned,
    CorrectedShares,
    InventoryReported,
    PodReserved,
    encode_event,
)
from gpushare.core.model import Card, CardLink, ContainerShare, PodRef

AT = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
NODE = "n" * 253  # the longest node name Kubernetes allows
POD = PodRef(namespace="n" * 63, name="p" * 253, uid="0" * 36)
UUID = "GPU-5f1c2d3e-aaaa-bbbb-cccc-dddddddddddd"


def inventory(cards: int) -> InventoryReported:
    return InventoryReported(
        id="inventory-" + "x" * 64,
        at=AT,
        node=NODE,
        cards=tuple(
            Card(
                index=i,
                uuid=f"{UUID[:-2]}{i:02d}",
                model="NVIDIA H100 80GB HBM3",
                memory_mib=81559,
                healthy=False,
                health_reason="XID 79: GPU has fallen off the bus " * 4,
            )
            for i in range(cards)
        ),
        source="nvml",
        heartbeat_seconds=30.0,
        driver_version="550.54.15",
        links=tuple(
            CardLink(a=a, b=b, path="NVLINK", nvlinks=18)
            for a in range(cards)
            for b in range(a + 1, cards)
        ),
        mps=True,
    )


def shares(containers: int, cards: int) -> tuple[ContainerShare, ...]:
    return tuple(
        ContainerShare(
            container=f"{'c' * 60}{c:03d}",
            card_index=k,
            card_uuid=f"{UUID[:-2]}{k:02d}",
            memory_mib=81559,
            core_percent=100,
        )
        for c in range(containers)
        for k in range(cards)
    )


def test_an_inventory_of_8_cards_of_80_gb_with_topology_fits_many_times() -> None:
    assert len(encode_event(inventory(8))) * 10 < INVENTORY_MAX_MSG_BYTES


def test_an_inventory_of_16_cards_fully_linked_fits() -> None:
    assert len(encode_event(inventory(16))) * 4 < INVENTORY_MAX_MSG_BYTES


def test_a_reservation_of_64_containers_on_8_cards_each_fits() -> None:
    event = PodReserved(id="r" * 100, at=AT, node=NODE, pod=POD, shares=shares(64, 8))

    assert len(encode_event(event)) < ALLOCATION_MAX_MSG_BYTES


def test_a_correction_of_16_pods_on_8_cards_fits() -> None:
    moved = CorrectedShares(pod=POD, reservation_id="r" * 100, shares=shares(4, 8))
    event = AllocationCorrected(
        id="c" * 100,
        at=AT,
        node=NODE,
        pod=POD,
        reservation_id="r" * 100,
        shares=shares(4, 8),
        reason="kubelet",
        also=(moved,) * 15,
    )

    assert len(encode_event(event)) < ALLOCATION_MAX_MSG_BYTES


def test_a_whole_80_gb_card_in_mib_units_is_recorded_in_a_few_bytes() -> None:
    """81,559 device IDs written out would be over a megabyte."""
    ids = [f"5f1c2d3e-{n}" for n in range(81559)]
    event = ContainerAssigned(
        id="a" * 100,
        at=AT,
        node=NODE,
        pod=POD,
        reservation_id="r" * 100,
        container="c" * 63,
        card_uuids=(UUID,),
        device_ids=compact_ids(ids),
    )

    assert len(encode_event(event)) < 2048


def test_every_stream_has_a_message_size_limit() -> None:
    for config in (inventory_config(), allocation_config(), rejected_config()):
        assert config.max_msg_size is not None
        assert config.max_msg_size > 0
    assert REJECTED_MAX_MSG_BYTES > ALLOCATION_MAX_MSG_BYTES  # a refused message fits whole
