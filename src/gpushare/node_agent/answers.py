"""What the device plugin answers one kubelet call (pure).

``GetPreferredAllocation`` and ``Allocate`` on one resource are decided alike: first
from the kubelet's pod-resources list, which names the pod being admitted
(:mod:`.admission`), else from the order-based guess (:mod:`.matching`). Either way the
call is for the pod's first container that asked the resource and has not had its call
on it yet, keyed or counting (:func:`~.matching.calls_to_come`). The service
(:mod:`.plugin`) gathers a :class:`Knowledge`, calls these functions, waits for the log
where they say so, and records what they decided.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from gpushare.core.state import NodeState
from gpushare.node_agent.admission import Admitting, ListedPod, Unknown, admitting_allocation
from gpushare.node_agent.device_table import DeviceTable
from gpushare.node_agent.matching import (
    NO_CALLS,
    Asks,
    Call,
    Claim,
    CountOnly,
    Match,
    NoMatch,
    ids_per_card,
    match_allocate,
    match_container,
    preferred_for,
    preferred_ids,
)


@dataclass(frozen=True)
class Knowledge:
    """Everything one call on one resource is decided on."""

    node: NodeState
    """The node's fold of the log."""
    table: DeviceTable
    """The resource's device IDs."""
    listed: Sequence[ListedPod] | None
    """The kubelet's pod-resources list; ``None`` when it did not answer."""
    asks: Asks
    claimed: Set[Claim] = frozenset()
    """Containers matched whose ``ContainerAssigned`` the fold has not applied yet."""
    answered: Set[Call] = NO_CALLS
    """Every call this agent answered, matched or counted, while its pod lives."""

    def admitting(self) -> Admitting | Unknown:
        return admitting_allocation(
            self.node,
            self.listed,
            self.table.resource,
            self.asks,
            self.claimed,
            answered=self.answered,
        )


def _behind(who: Admitting | Unknown) -> bool:
    """The kubelet lists no pod of ours waiting for the resource: it is admitting one the
    fold does not show yet (the binder appends ``PodBound`` just after the binding)."""
    return isinstance(who, Unknown) and who.listed and who.waiting == 0


def advise(
    known: Knowledge,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    offered: Set[str],
) -> tuple[str, ...] | None:
    """The IDs to advise: the calling container's, on its own cards; ``None`` when no
    container is known to wait for this many (the caller may wait for the log)."""
    who = known.admitting()
    if isinstance(who, Admitting):
        pending = who.container or who.counting
        assert pending is not None
        found = preferred_for(
            pending,
            known.table,
            available=available,
            must_include=must_include,
            size=size,
            offered=offered,
        )
        if found is not None or who.container is not None:
            return found
    if _behind(who):
        return None
    return preferred_ids(
        known.node,
        known.table,
        known.claimed,
        available=available,
        must_include=must_include,
        size=size,
        asks=known.asks,
        offered=offered,
        answered=known.answered,
    )


def allocation_for(known: Knowledge, device_ids: Sequence[str]) -> Match | CountOnly | NoMatch:
    """The container an ``Allocate`` with these IDs is for: matched on its keyed
    resource (to the cards the IDs are on), counted on another; or why none is."""
    return _allocation(known, known.admitting(), device_ids)


def settled_allocation(known: Knowledge, device_ids: Sequence[str]) -> Match | CountOnly | None:
    """:func:`allocation_for`, or ``None`` while the log may still explain the call: the
    fold is behind the kubelet, or nothing matches yet (the caller waits for the log)."""
    who = known.admitting()
    if _behind(who):
        return None
    found = _allocation(known, who, device_ids)
    return None if isinstance(found, NoMatch) else found


def _allocation(
    known: Knowledge, who: Admitting | Unknown, device_ids: Sequence[str]
) -> Match | CountOnly | NoMatch:
    if isinstance(who, Admitting) and who.container is not None:
        per_card = ids_per_card(known.table, device_ids)
        if isinstance(per_card, NoMatch):
            return NoMatch(f"on node {known.node.name}: {per_card.reason}")
        return match_container(who.container, known.table, per_card)
    if isinstance(who, Admitting) and who.counting is not None:
        counting = who.counting
        keyed = known.asks.keyed(*counting.claim) or ""
        return CountOnly(allocation=counting.allocation, container=counting.name, keyed=keyed)
    return match_allocate(
        known.node, known.table, known.claimed, device_ids, known.asks, answered=known.answered
    )
