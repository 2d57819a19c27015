"""SimulatedBackend: cards from MiB sizes, stable UUIDs, health flipped by hand, topologies."""

from __future__ import annotations

import re
import threading

import pytest

from gpushare.reporter.health import HealthEvent
from gpushare.reporter.mps import MpsMode
from gpushare.reporter.simulated import (
    SIMULATED_TOPOLOGIES,
    SimulatedBackend,
    SimulatedTopology,
    simulated_uuid,
)

NVML_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_one_card_per_size_heterogeneous_allowed() -> None:
    cards = SimulatedBackend("gpu-b", (16276, 16276, 32510)).read_cards()
    assert [(card.index, card.memory_mib) for card in cards] == [
        (0, 16276),
        (1, 16276),
        (2, 32510),
    ]
    assert [card.model for card in cards] == [
        "gpushare-simulated-16276MiB",
        "gpushare-simulated-16276MiB",
        "gpushare-simulated-32510MiB",
    ]
    assert all(card.healthy for card in cards)


def test_uuids_are_nvml_shaped_stable_and_distinct() -> None:
    first = [card.uuid for card in SimulatedBackend("gpu-a", (1000, 1000)).read_cards()]
    again = [card.uuid for card in SimulatedBackend("gpu-a", (1000, 1000)).read_cards()]
    other = [card.uuid for card in SimulatedBackend("gpu-b", (1000, 1000)).read_cards()]
    assert first == again
    assert len(set(first + other)) == 4
    assert all(NVML_UUID.fullmatch(uuid) for uuid in first + other)
    # The node-agent's device IDs use the first 8 hex digits: they differ too.
    assert len({uuid[4:12] for uuid in first + other}) == 4
    assert first[1] == simulated_uuid("gpu-a", 1)


def test_a_card_marked_unhealthy_and_healthy_again() -> None:
    backend = SimulatedBackend("gpu-a", (1000, 2000))
    uuid = backend.card_uuid(1)
    backend.mark_unhealthy(1, "XID 79")
    assert [(card.healthy, card.health_reason) for card in backend.read_cards()] == [
        (True, ""),
        (False, "XID 79"),
    ]
    assert backend.poll_health_events(timeout=0) == [
        HealthEvent(card_uuid=uuid, healthy=False, reason="XID 79")
    ]
    backend.mark_healthy(1)
    assert all(card.healthy for card in backend.read_cards())
    assert backend.poll_health_events(timeout=0) == [HealthEvent(card_uuid=uuid, healthy=True)]


def test_marking_a_card_the_node_lacks_says_so() -> None:
    backend = SimulatedBackend("gpu-a", (1000,))
    with pytest.raises(ValueError, match="node gpu-a has no card 3 \\(it has 1\\)"):
        backend.mark_unhealthy(3)


def test_a_waiting_poll_returns_when_a_card_is_marked() -> None:
    backend = SimulatedBackend("gpu-a", (1000,))
    marked = threading.Timer(0.01, backend.mark_unhealthy, args=(0,))
    marked.start()
    try:
        events = backend.poll_health_events(timeout=60)
    finally:
        marked.join()
    assert [event.healthy for event in events] == [False]


def test_close_wakes_a_waiting_poll() -> None:
    backend = SimulatedBackend("gpu-a", (1000,))
    closer = threading.Timer(0.01, backend.close)
    closer.start()
    try:
        assert backend.poll_health_events(timeout=60) == []
    finally:
        closer.join()


def link_names(backend: SimulatedBackend) -> dict[tuple[int, int], str]:
    return {
        (link.a, link.b): f"NV{link.nvlinks}" if link.path == "NVLINK" else link.path
        for link in backend.read_links()
    }


def test_by_default_simulated_cards_have_no_links_and_no_mps() -> None:
    backend = SimulatedBackend("gpu-a", (1000,) * 4)
    assert backend.read_links() == ()
    assert not backend.mps_enabled()


def test_nvlink_pairs_bridge_cards_two_by_two() -> None:
    backend = SimulatedBackend("gpu-a", (1000,) * 5, topology="nvlink-pairs")
    names = link_names(backend)
    assert len(names) == 10  # every pair of five cards
    assert {pair for pair, name in names.items() if name == "NV4"} == {(0, 1), (2, 3)}
    assert {name for pair, name in names.items() if pair not in {(0, 1), (2, 3)}} == {"SYS"}


def test_nvswitch_joins_every_pair_by_eighteen_links() -> None:
    names = link_names(SimulatedBackend("gpu-a", (1000,) * 8, topology="nvswitch"))
    assert len(names) == 28
    assert set(names.values()) == {"NV18"}


def test_pcie_joins_every_pair_through_the_host_bridge() -> None:
    names = link_names(SimulatedBackend("gpu-a", (1000,) * 3, topology="pcie"))
    assert names == {(0, 1): "PHB", (0, 2): "PHB", (1, 2): "PHB"}


@pytest.mark.parametrize("topology", SIMULATED_TOPOLOGIES)
def test_one_card_has_no_pairs(topology: SimulatedTopology) -> None:
    assert SimulatedBackend("gpu-a", (1000,), topology=topology).read_links() == ()


@pytest.mark.parametrize(("mode", "mps"), [("on", True), ("off", False), ("auto", False)])
def test_simulated_mps_is_what_the_flag_says_and_auto_finds_no_daemon(
    mode: MpsMode, mps: bool
) -> None:
    assert SimulatedBackend("gpu-a", (1000,), mps=mode).mps_enabled() is mps
