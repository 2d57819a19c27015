"""The node agent's Prometheus metrics (served with ``--metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ALLOCATIONS = Counter(
    "gpushare_node_agent_allocations",
    "Allocate calls, by outcome: assigned, refused (no bound container of the log matches "
    "the device IDs) or error (the call failed).",
    ["node", "outcome"],
)
PREFERRED = Counter(
    "gpushare_node_agent_preferred_allocations",
    "Containers GetPreferredAllocation advised on, by outcome: matched (the card the log "
    "chose for a waiting container) or fallback (none waiting: any IDs of one card).",
    ["node", "outcome"],
)
CARD_MISMATCHES = Counter(
    "gpushare_node_agent_card_mismatches",
    "Containers whose kubelet device IDs are on another card than the log gave them.",
    ["node"],
)
RECONCILE_FINDINGS = Gauge(
    "gpushare_node_agent_reconcile_findings",
    "Disagreements between the kubelet's pod-resources and the log at the last check, by kind.",
    ["node", "kind"],
)
FOREIGN_CARDS = Gauge(
    "gpushare_node_agent_foreign_cards",
    "Cards of the node held by pods of other device plugins (counted as wholly used).",
    ["node"],
)
REGISTRATIONS = Counter(
    "gpushare_node_agent_registrations",
    "Successful registrations with the kubelet (more than one means the kubelet restarted).",
    ["node"],
)
