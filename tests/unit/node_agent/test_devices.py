"""Device IDs per card, the ID → card map, and the ListAndWatch size check."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.model import Card
from gpushare.node_agent.device_table import (
    HEALTHY,
    KUBELET_MAX_RECEIVE_BYTES,
    UNHEALTHY,
    DeviceListTooLarge,
    DeviceTable,
    IdsByCard,
    build_device_table,
    check_message_size,
    list_and_watch_response,
    short_card_ids,
)
from tests.unit.node_agent.builders import card


def gpu(index: int, uuid: str, mib: int = 4096) -> Card:
    return Card(index=index, uuid=uuid, model="A100", memory_mib=mib)


@pytest.mark.parametrize(
    ("cards", "expected"),
    [
        pytest.param(
            [gpu(0, "GPU-5f1c2a3b-aaaa-bbbb"), gpu(1, "GPU-9e8d7c6b-cccc-dddd")],
            ["5f1c2a3b", "9e8d7c6b"],
            id="eight hex digits after GPU-",
        ),
        pytest.param(
            [gpu(0, "GPU-ABCDEF12-0"), gpu(1, "GPU-abcdef12-1"), gpu(2, "GPU-12345678-2")],
            ["gpu0", "gpu1", "12345678"],
            id="a shared prefix falls back to the index",
        ),
        pytest.param([gpu(0, "GPU-0"), gpu(1, "GPU-1")], ["0", "1"], id="short simulated UUIDs"),
        pytest.param(
            [gpu(3, "GPU-aaaaaaaa-1"), gpu(3, "GPU-aaaaaaaa-2")],
            ["gpu3", "card1"],
            id="even the index clashes",
        ),
    ],
)
def test_short_card_ids(cards: list[Card], expected: list[str]) -> None:
    names = short_card_ids(cards)
    assert [names[c.uuid] for c in cards] == expected


@pytest.mark.parametrize(("unit", "per_card"), [("MiB", 4096), ("GiB", 4)])
def test_one_id_per_memory_unit(unit: str, per_card: int) -> None:
    table = build_device_table([gpu(0, "GPU-5f1c2a3b-0"), gpu(1, "GPU-9e8d7c6b-1")], unit)
    devices = [device for device, _ in table.devices()]
    assert len(devices) == table.count == 2 * per_card
    assert devices[0] == "5f1c2a3b-0"
    assert devices[per_card - 1] == f"5f1c2a3b-{per_card - 1}"
    assert devices[per_card] == "9e8d7c6b-0"


def test_gib_rounds_a_card_down_to_whole_units() -> None:
    table = build_device_table([gpu(0, "GPU-5f1c2a3b-0", mib=15109)], "GiB")
    assert table.count == 14


def test_every_id_maps_back_to_its_card() -> None:
    cards = [card(0), card(1)]
    table = build_device_table(cards, "GiB")
    for on in cards:
        assert {table.card_of(device) for device in table.ids_of(on)} == {on}


@pytest.mark.parametrize("device", ["nope", "00a1b2c3-16", "00a1b2c3-x", "ffffffff-0", "-0", ""])
def test_ids_the_table_never_advertised_map_to_nothing(device: str) -> None:
    table = build_device_table([card(0)], "GiB")
    assert table.card_of(device) is None


THREE_CARDS = build_device_table([card(0), card(1), card(2)], "GiB")
ON_0, ON_1, ON_2 = (THREE_CARDS.ids_of(on) for on in THREE_CARDS.cards)
UUID_0, UUID_1, UUID_2 = (on.uuid for on in THREE_CARDS.cards)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param([], IdsByCard({}, ()), id="none"),
        pytest.param(ON_1[:3], IdsByCard({UUID_1: 3}, ()), id="one card"),
        pytest.param(
            [ON_2[0], ON_0[1], ON_2[1], ON_0[0]],
            IdsByCard({UUID_0: 2, UUID_2: 2}, ()),
            id="two cards, in the table's order",
        ),
        pytest.param([ON_0[0], ON_0[0]], IdsByCard({UUID_0: 1}, ()), id="distinct IDs counted"),
        pytest.param(
            ["nope", ON_0[0], "00a1b2c3-16", "nope"],
            IdsByCard({UUID_0: 1}, ("00a1b2c3-16", "nope")),
            id="IDs never advertised, sorted and once",
        ),
    ],
)
def test_ids_sorted_by_card(devices: list[str], expected: IdsByCard) -> None:
    assert THREE_CARDS.sort_by_card(devices) == expected


def by_lookup(table: DeviceTable, devices: list[str]) -> IdsByCard:
    """:meth:`DeviceTable.sort_by_card` one ID at a time."""
    distinct = set(devices)
    counts = Counter(on.uuid for d in distinct if (on := table.card_of(d)) is not None)
    per_card = {on.uuid: counts[on.uuid] for on in table.cards if on.uuid in counts}
    return IdsByCard(per_card, tuple(sorted(d for d in distinct if table.card_of(d) is None)))


@given(
    st.lists(
        st.one_of(
            st.sampled_from([*ON_0, *ON_1, *ON_2]),
            st.builds("{}-{}".format, st.sampled_from(["00a1b2c3", "x"]), st.integers(0, 20)),
        ),
        max_size=40,
    )
)
def test_sorting_by_card_is_looking_each_id_up(devices: list[str]) -> None:
    assert THREE_CARDS.sort_by_card(devices) == by_lookup(THREE_CARDS, devices)


def test_unhealthy_cards_are_listed_as_unhealthy() -> None:
    table = build_device_table([card(0), card(1, healthy=False)], "GiB")
    response = list_and_watch_response(table)
    health = {device.ID: device.health for device in response.devices}
    assert {health[d] for d in table.ids_of(card(0))} == {HEALTHY}
    assert {health[d] for d in table.ids_of(card(1, healthy=False))} == {UNHEALTHY}


def test_unknown_memory_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="memory unit"):
        build_device_table([card(0)], "KiB")


def eight_80gb_cards() -> list[Card]:
    return [gpu(i, f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-x", mib=81920) for i in range(8)]


def test_eight_80gb_cards_fit_in_gib() -> None:
    table = build_device_table(eight_80gb_cards(), "GiB")
    size = check_message_size(list_and_watch_response(table), "GiB")
    assert table.count == 640
    assert size < KUBELET_MAX_RECEIVE_BYTES


def expected_size(device_ids: list[str], health: str) -> int:
    """protobuf by hand: Device{1: ID, 2: health} inside ListAndWatchResponse{1: repeated}."""

    def field(payload: int) -> int:
        length_bytes = 1 if payload < 128 else 2 if payload < 16384 else 3
        return 1 + length_bytes + payload

    return sum(field(field(len(device)) + field(len(health))) for device in device_ids)


@pytest.mark.slow
def test_eight_80gb_cards_in_mib_are_reported_too_large_with_their_size() -> None:
    table = build_device_table(eight_80gb_cards(), "MiB")
    response = list_and_watch_response(table)
    with pytest.raises(DeviceListTooLarge) as caught:
        check_message_size(response, "MiB")
    error = caught.value
    assert error.devices == 8 * 81920
    assert error.size == expected_size([d for d, _ in table.devices()], HEALTHY)
    assert error.size > KUBELET_MAX_RECEIVE_BYTES
    assert "GiB" in str(error)
    assert str(KUBELET_MAX_RECEIVE_BYTES) in str(error)


def test_one_80gb_card_still_fits_in_mib() -> None:
    table = build_device_table(eight_80gb_cards()[:1], "MiB")
    assert check_message_size(list_and_watch_response(table), "MiB") < KUBELET_MAX_RECEIVE_BYTES
