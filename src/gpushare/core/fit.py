"""Does a node fit a request, and if not, why, in words a person can act on."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from gpushare.core.dra import DEVICE_CLASS, FRONT_DOOR_LABEL
from gpushare.core.placement import DEFAULT_MAX_CONTAINERS_PER_CARD, can_place, model_accepted
from gpushare.core.requests import ContainerRequest, PodRequest
from gpushare.core.state import NodeState
from gpushare.core.view import CardView

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


def _describe_cards(node: NodeState, with_core: bool = False) -> str:
    parts = []
    for card, view in zip(node.cards, node.view.cards, strict=True):
        state = f"{view.free_mib}/{card.memory_mib} MiB free"
        if with_core:
            state += f", {view.free_core} % core free, {view.containers} containers"
        if not card.healthy:
            state = f"unhealthy ({card.health_reason or 'no reason given'})"
        parts.append(f"GPU{card.index} {state}")
    return ", ".join(parts)


def _unfit(kind: str, reason: str, unresolvable: bool = False) -> FitVerdict:
    return FitVerdict(kind=kind, fits=False, unresolvable=unresolvable, reason=reason)


def _never_fits(node: NodeState, request: PodRequest) -> FitVerdict | None:
    """Why no amount of eviction could make room, if that is so."""
    healthy = [card for card in node.view.cards if card.healthy]
    if not healthy:
        return _unfit(
            "no_healthy_gpu",
            f"no healthy GPU on this node ({_describe_cards(node) or 'no cards'})",
            unresolvable=True,
        )
    usable = [card for card in healthy if model_accepted(card, request.models)]
    if not usable:
        models = ", ".join(sorted({card.model for card in healthy}))
        return _unfit(
            "gpu_model",
            f"accepts GPU models {' | '.join(request.models)}; this node has {models}",
            unresolvable=True,
        )
    for wanted in request.containers:
        if wanted.cards > len(usable):
            return _unfit(
                "too_few_cards",
                f"{wanted.container} needs {wanted.cards} cards; this node has "
                f"{len(usable)} usable",
                unresolvable=True,
            )
        big_enough = [card for card in usable if _could_hold(card, wanted)]
        if len(big_enough) < wanted.cards:
            largest = max(card.memory_mib for card in usable)
            return _unfit(
                "larger_than_any_card",
                f"needs {wanted.memory_on(largest) if wanted.memory_ratio else wanted.memory_mib}"
                f" MiB of GPU memory on one card, more than any card here has in total "
                f"(largest {largest} MiB)",
                unresolvable=True,
            )
    return None


def _could_hold(card: CardView, wanted: ContainerRequest) -> bool:
    return wanted.memory_on(card.memory_mib) <= card.memory_mib


def check_fit(
    node: NodeState,
    request: PodRequest,
    now: datetime,
    *,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
) -> FitVerdict:
    """Whether the request can be placed on ``node`` right now, and if not, why."""
    if (
        node.front_door == "extender"
        and not is_stale(node, now)
        and can_place(node.view, request, max_per_card=max_per_card)
    ):
        return FITS
    return why_unfit(node, request, now, max_per_card=max_per_card)


def why_unfit(
    node: NodeState,
    request: PodRequest,
    now: datetime,
    *,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
) -> FitVerdict:
    """Why ``request`` does not fit ``node``, once a search has found no placement there
    (no search of its own: bind searches once, and asks this only when that found none)."""
    fresh = not is_stale(node, now)
    if node.inventory_at is None:
        return _unfit(
            "no_inventory",
            "no GPU inventory reported for this node (is the gpushare reporter running?)",
            unresolvable=True,
        )
    if not fresh:
        silence = int((now - node.inventory_at).total_seconds())
        return _unfit(
            "stale_inventory",
            f"GPU inventory is stale: the reporter's last heartbeat was {silence}s ago",
            unresolvable=True,
        )
    if node.front_door == "dra":
        return _unfit(
            "dra_node",
            f"this node's GPUs are handed out through DRA (label {FRONT_DOOR_LABEL}=dra): "
            f"ask for them with a ResourceClaim of DeviceClass {DEVICE_CLASS}",
            unresolvable=True,
        )
    never = _never_fits(node, request)
    if never is not None:
        return never
    if request.memory_only:
        need = request.memory_mib
        if need <= node.max_free_mib:
            return _unfit(
                "containers_per_card",
                f"needs {need} MiB of GPU memory on one card; the cards with room already "
                f"hold {max_per_card} containers, the most allowed per card",
            )
        return _unfit(
            "insufficient_free_memory",
            f"needs {need} MiB of GPU memory on one card; the most free on any card is "
            f"{node.max_free_mib} MiB ({_describe_cards(node)})",
        )
    return _unfit(
        "insufficient_free_gpu",
        f"needs {request.describe()}; no combination of cards has that free "
        f"(at most {max_per_card} containers per card; {_describe_cards(node, with_core=True)})",
    )
