"""Which cards other device plugins' pods hold: the IDs each plugin names cards by."""

from __future__ import annotations

import pytest

from gpushare.core.events import ForeignHold
from gpushare.node_agent.foreign import ForeignDevices, card_named, match_foreign, overlaps
from tests.unit.node_agent.builders import (
    card,
    inventory,
    node_state,
    reserve,
    reserve_and_bind,
    share,
)

GPU0, GPU1, GPU2 = card(0), card(1), card(2)
CARDS = (GPU0, GPU1, GPU2)


@pytest.mark.parametrize(
    ("resource", "device_id", "expected"),
    [
        pytest.param("nvidia.com/gpu", GPU1.uuid, GPU1, id="uuid"),
        pytest.param("nvidia.com/gpu", GPU1.uuid.lower(), GPU1, id="uuid-any-case"),
        pytest.param("nvidia.com/gpu", f"{GPU2.uuid}::3", GPU2, id="time-sliced-replica"),
        pytest.param("nvidia.com/mig-1g.5gb", f"MIG-{GPU0.uuid}/1/0", GPU0, id="old-mig"),
        pytest.param("example.com/vgpu", f"vgpu-{GPU2.uuid}-7", GPU2, id="any-plugin-naming-uuid"),
        pytest.param("nvidia.com/gpu", "1", GPU1, id="index-strategy"),
        pytest.param("nvidia.com/mig-1g.5gb", "2:0", GPU2, id="mig-index-pair"),
        pytest.param("example.com/vgpu", "1", None, id="index-only-for-nvidia"),
        pytest.param("nvidia.com/gpu", "7", None, id="no-such-index"),
        pytest.param(
            "nvidia.com/mig-1g.5gb", "MIG-5f1c0000-aaaa-bbbb-cccc-000000000000", None, id="new-mig"
        ),
        pytest.param("nvidia.com/gpu", "GPU-unknown", None, id="another-nodes-card"),
    ],
)
def test_which_card_an_id_names(resource: str, device_id: str, expected: object) -> None:
    assert card_named(CARDS, resource, device_id) == expected


def test_a_longer_uuid_wins_over_a_prefix_of_it() -> None:
    short = card(3)
    longer = type(short)(index=4, uuid=short.uuid + "-x", model="T4", memory_mib=1)
    assert card_named((short, longer), "nvidia.com/gpu", f"{longer.uuid}::0") == longer


def test_holds_per_card_with_their_pods_and_resources() -> None:
    devices = [
        ForeignDevices("ml/a", "cuda", "nvidia.com/gpu", (GPU2.uuid, GPU0.uuid)),
        ForeignDevices("ml/b", "cuda", "nvidia.com/gpu", (f"{GPU0.uuid}::1",)),
        ForeignDevices(
            "ml/c", "main", "nvidia.com/mig-1g.5gb", ("MIG-new", f"MIG-{GPU2.uuid}/2/0")
        ),
    ]
    found = match_foreign(CARDS, devices)
    assert found.holds == (
        ForeignHold(card_uuid=GPU0.uuid, resource="nvidia.com/gpu", pods=("ml/a", "ml/b")),
        ForeignHold(
            card_uuid=GPU2.uuid,
            resource="nvidia.com/gpu,nvidia.com/mig-1g.5gb",
            pods=("ml/a", "ml/c"),
        ),
    )
    assert found.unmatched == ("nvidia.com/mig-1g.5gb:MIG-new",)


def test_nothing_held_is_an_empty_match() -> None:
    found = match_foreign(CARDS, [])
    assert (found.holds, found.unmatched) == ((), ())


def test_overlaps_name_our_reservations_on_held_cards() -> None:
    ours = reserve("p", share("a", GPU0, 100), share("b", GPU0, 100), share("c", GPU1, 100))
    node = node_state([inventory(*CARDS), *reserve_and_bind(ours)])
    hold = ForeignHold(card_uuid=GPU0.uuid, resource="nvidia.com/gpu")
    assert [(h, a.reservation_id) for h, a in overlaps(node, [hold])] == [(hold, ours.id)]
    assert overlaps(node, [ForeignHold(card_uuid=GPU2.uuid, resource="nvidia.com/gpu")]) == []
