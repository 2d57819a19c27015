"""The only home of stream names and subject strings.

Node names are DNS subdomains and may contain dots, which NATS reads as token
separators; a dot becomes ``~`` in a subject token (``~`` is never in a node name).
"""

from __future__ import annotations

INVENTORY_STREAM = "GPUSHARE_INVENTORY"
ALLOCATION_STREAM = "GPUSHARE_ALLOCATIONS"

INVENTORY_PREFIX = "gpushare.inventory"
ALLOCATION_PREFIX = "gpushare.alloc"

ALL_INVENTORY = f"{INVENTORY_PREFIX}.>"
ALL_ALLOCATIONS = f"{ALLOCATION_PREFIX}.>"


def node_token(node: str) -> str:
    return node.replace(".", "~")


def inventory_subject(node: str) -> str:
    return f"{INVENTORY_PREFIX}.{node_token(node)}"


def allocation_subject(node: str) -> str:
    return f"{ALLOCATION_PREFIX}.{node_token(node)}"
