"""The per-card gauges are the fold's figures, however many scrapes and events came between:
lines kept from an earlier scrape are never stale."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpushare.allocator.card_gauges import GAUGES, CardGauges
from gpushare.core.state import ClusterState
from tests.unit.core.event_streams import history
from tests.unit.core.factories import T0, inventory, make_card

Samples = dict[tuple[str, str, str, str], float]


def scraped(text: bytes) -> Samples:
    """``(gauge, node, card, uuid) -> value``, parsed as Prometheus parses the text."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        assert family.type == "gauge"
        for sample in family.samples:
            key = (sample.name, sample.labels["node"], sample.labels["card"], sample.labels["uuid"])
            assert key not in samples, f"{key} twice"
            samples[key] = sample.value
    return samples


def expected(state: ClusterState) -> Samples:
    """The fold's figure for every gauge of every card."""
    return {
        (gauge.name, name, str(card.index), card.uuid): gauge.read(node, card, view)
        for name, node in state.nodes.items()
        for card, view in zip(node.cards, node.view.cards, strict=False)
        for gauge in GAUGES
    }


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), length=st.integers(1, 80), scrapes=st.integers(1, 6))
def test_every_scrape_is_the_fold_as_it_is_then(seed: int, length: int, scrapes: int) -> None:
    pairs = history(random.Random(seed), length)
    state = ClusterState()
    gauges = CardGauges(lambda: state)
    cuts = sorted(random.Random(seed + 1).choices(range(len(pairs) + 1), k=scrapes))
    done = 0
    for cut in cuts:
        for seq, event in pairs[done:cut]:
            state.apply(event, seq)
        done = cut
        assert scraped(gauges.exposition()) == expected(state)
    assert gauges.exposition() == CardGauges(lambda: state).exposition()


def test_a_heartbeat_with_the_same_cards_renders_the_same_lines() -> None:
    state = ClusterState()
    state.apply(inventory("n", [make_card(0, node="n"), make_card(1, node="n")]), 0)
    gauges = CardGauges(lambda: state)
    before = gauges.exposition()
    again = inventory(
        "n", [make_card(0, node="n"), make_card(1, node="n")], at=T0 + timedelta(seconds=5)
    )
    state.apply(again, 0)
    assert state.node("n").inventory_at == again.at
    assert gauges.exposition() == before


def test_a_node_gone_from_the_fold_is_gone_from_the_scrape() -> None:
    state = ClusterState()
    for name in ("a", "b"):
        state.apply(inventory(name, [make_card(0, node=name)]), 0)
    gauges = CardGauges(lambda: state)
    assert {node for _, node, _, _ in scraped(gauges.exposition())} == {"a", "b"}
    state.nodes = {"a": state.nodes["a"]}
    assert {node for _, node, _, _ in scraped(gauges.exposition())} == {"a"}


@pytest.mark.parametrize("uuid", ['GPU-"quoted"', "GPU-back\\slash", "GPU-new\nline"])
def test_label_values_are_escaped(uuid: str) -> None:
    state = ClusterState()
    state.apply(inventory("n", [make_card(0, node="n").__replace__(uuid=uuid)]), 0)
    samples = scraped(CardGauges(lambda: state).exposition())
    assert {key[3] for key in samples} == {uuid}
