"""The only home of stream names and subject strings.

Node names are DNS subdomains and may contain dots, which NATS reads as token
separators; a dot becomes ``~`` in a subject token (``~`` is never in a node name).
"""

from __future__ import annotations

INVENTORY_STREAM = "GPUSHARE_INVENTORY"
ALLOCATION_STREAM = "GPUSHARE_ALLOCATIONS"
DECISION_STREAM = "GPUSHARE_DECISIONS"
"""The extender's reasoning per pod (filter and prioritize records), kept for a while."""
REJECTED_STREAM = "GPUSHARE_REJECTED"
"""Messages a consumer could not decode: terminated where they were, recorded here."""
SNAPSHOT_BUCKET = "GPUSHARE_SNAPSHOTS"
"""The JetStream KV bucket of folded-state snapshots (start-up without a full replay)."""

INVENTORY_PREFIX = "gpushare.inventory"
ALLOCATION_PREFIX = "gpushare.alloc"
DECISION_PREFIX = "gpushare.decisions"
REJECTED_PREFIX = "gpushare.rejected"

ALL_INVENTORY = f"{INVENTORY_PREFIX}.>"
ALL_ALLOCATIONS = f"{ALLOCATION_PREFIX}.>"
ALL_DECISIONS = f"{DECISION_PREFIX}.>"
ALL_REJECTED = f"{REJECTED_PREFIX}.>"


def node_token(node: str) -> str:
    return node.replace(".", "~")


def inventory_subject(node: str) -> str:
    return f"{INVENTORY_PREFIX}.{node_token(node)}"


def allocation_subject(node: str) -> str:
    return f"{ALLOCATION_PREFIX}.{node_token(node)}"


def decision_subject(namespace: str, name: str) -> str:
    """One pod's decision records (a namespace is a DNS label: it has no dots)."""
    return f"{DECISION_PREFIX}.{namespace}.{node_token(name)}"


def rejected_subject(stream: str) -> str:
    return f"{REJECTED_PREFIX}.{stream}"
