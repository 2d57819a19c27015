"""Does a node fit a request, and if not, why, in words a person can act on."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from gpushare.core.requests import PodRequest
from gpushare.core.state import NodeState

STALE_AFTER_HEARTBEATS = 3
"""A node whose reporter has been silent this many heartbeat periods is not offered."""


class FitVerdict(msgspec.Struct, frozen=True, kw_only=True):
    fits: bool
    reason: str = ""
    unresolvable: bool = False
    """No preemption on this node could help (kube-scheduler's FailedAndUnresolvableNodes)."""
    kind: str = ""
    """A short, stable label of the reason (for metrics), empty when it fits."""


FITS = FitVerdict(fits=True)


def stale_cutoff(now: datetime, heartbeat_seconds: float) -> datetime:
    """Inventory reported before this is stale (silent for too many heartbeats)."""
    return now - timedelta(seconds=STALE_AFTER_HEARTBEATS * heartbeat_seconds)


def is_stale(node: NodeState, now: datetime) -> bool:
    if node.inventory_at is None:
        return True
    return node.inventory_at < stale_cutoff(now, node.heartbeat_seconds)


def _describe_cards(node: NodeState) -> str:
    parts = []
    for card in node.cards:
        state = f"{node.free_mib(card)}/{card.memory_mib} MiB free"
        if not card.healthy:
            state = f"unhealthy ({card.health_reason or 'no reason given'})"
        parts.append(f"GPU{card.index} {state}")
    return ", ".join(parts)


def check_fit(node: NodeState, request: PodRequest, now: datetime) -> FitVerdict:
    """Whether one healthy card of ``node`` has ``request.memory_mib`` free right now."""
    need = request.memory_mib
    if need <= node.max_free_mib and not is_stale(node, now):
        return FITS
    if node.inventory_at is None:
        return FitVerdict(
            kind="no_inventory",
            fits=False,
            unresolvable=True,
            reason="no GPU inventory reported for this node (is the gpushare reporter running?)",
        )
    if is_stale(node, now):
        silence = int((now - node.inventory_at).total_seconds())
        return FitVerdict(
            kind="stale_inventory",
            fits=False,
            unresolvable=True,
            reason=f"GPU inventory is stale: the reporter's last heartbeat was {silence}s ago",
        )
    healthy = [card for card in node.cards if card.healthy]
    if not healthy:
        return FitVerdict(
            kind="no_healthy_gpu",
            fits=False,
            unresolvable=True,
            reason=f"no healthy GPU on this node ({_describe_cards(node) or 'no cards'})",
        )
    largest = max(card.memory_mib for card in healthy)
    if need > largest:
        return FitVerdict(
            kind="larger_than_any_card",
            fits=False,
            unresolvable=True,
            reason=(
                f"needs {need} MiB of GPU memory on one card, more than any card here has "
                f"in total (largest {largest} MiB)"
            ),
        )
    return FitVerdict(
        kind="insufficient_free_memory",
        fits=False,
        reason=(
            f"needs {need} MiB of GPU memory on one card; the most free on any card is "
            f"{node.max_free_mib} MiB ({_describe_cards(node)})"
        ),
    )
