"""The reporter's Prometheus metrics (served with ``--metrics-port``), by node."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from gpushare.core.model import Card

PUBLISHES = Counter(
    "gpushare_reporter_inventory_publishes",
    "Inventory publishes, by node and outcome: changed (the inventory changed), heartbeat "
    "(the same inventory again), failed (NATS refused or was away; retried next round).",
    ["node", "outcome"],
)
BACKEND_ERRORS = Counter(
    "gpushare_reporter_backend_errors",
    "Failures of the GPU backend (NVML, or a fixture), by node and operation: read (the "
    "cards could not be read; that round is skipped) or health_poll (waiting for XID events).",
    ["node", "operation"],
)
NVML_ERRORS = Counter(
    "gpushare_reporter_nvml_errors",
    "NVML device queries that failed while reading the cards, by NVML call (the card is "
    "then reported unhealthy with the error).",
    ["call"],
)
CARDS = Gauge(
    "gpushare_reporter_cards",
    "Cards of the node at the last read, by health (healthy, unhealthy).",
    ["node", "health"],
)


def count_cards(node: str, cards: Iterable[Card]) -> None:
    healthy = unhealthy = 0
    for card in cards:
        if card.healthy:
            healthy += 1
        else:
            unhealthy += 1
    CARDS.labels(node, "healthy").set(healthy)
    CARDS.labels(node, "unhealthy").set(unhealthy)
