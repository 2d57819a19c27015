"""The kubelet's device manager calling the node agent's decisions, without sockets.

``pkg/kubelet/cm/devicemanager`` admits one pod at a time; for each container in spec
order it goes over the container's limits (a Go map: the order of its resources differs
from run to run) and, per device-plugin resource, calls ``GetPreferredAllocation`` with
every free ID, takes the advice where it can, and calls ``Allocate`` with what it took.
The call names neither pod nor container. :class:`KubeletCalls` makes those calls into
the same pure functions the device plugin answers with (:mod:`gpushare.node_agent.answers`)
and keeps what the plugin keeps between calls (claims, answered calls, the log).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpushare.core.events import AnyEvent, ContainerAssigned
from gpushare.core.plugin_resources import container_demand, keyed_resource
from gpushare.core.state import NodeState
from gpushare.node_agent.admission import ListedPod
from gpushare.node_agent.answers import Knowledge, advise, allocation_for
from gpushare.node_agent.device_table import DeviceTable
from gpushare.node_agent.matching import (
    Asks,
    Claim,
    CountOnly,
    Match,
    NoMatch,
    exactly,
    fallback_ids,
    offer_of,
)
from tests.unit.node_agent.builders import NODE, T0, node_state


@dataclass(frozen=True)
class Limits:
    """One container of a pod spec, its resources in the order the kubelet goes over them."""

    container: str
    limits: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Served:
    """One ``(container, resource)`` call: what was advised, taken, and decided."""

    pod: str
    container: str
    resource: str
    advised: tuple[str, ...]
    taken: tuple[str, ...]
    outcome: Match | CountOnly | NoMatch


@dataclass
class KubeletCalls:
    """The device manager of one node and, across its calls, the node agent's memory."""

    tables: Mapping[str, DeviceTable]
    events: list[AnyEvent]
    lists_pods: bool = True
    """Whether pod-resources answers (else the agent falls back to the order-based guess)."""
    log_behind: bool = False
    """Whether the fold shows a pod's ``ContainerAssigned`` only once the pod is admitted
    (meanwhile the agent's claims stand in)."""
    claimed: set[Claim] = field(default_factory=set)
    answered: set[tuple[str, str, str]] = field(default_factory=set)
    """``(reservation, container, resource)``: every call answered, matched or counted."""
    held: dict[str, set[str]] = field(default_factory=dict)
    """Resource → the IDs the kubelet has handed out."""
    admitted: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    """Pod name → container → the resources it holds IDs of (what pod-resources lists)."""
    served: list[Served] = field(default_factory=list)

    @property
    def node(self) -> NodeState:
        return node_state(self.events)

    def admit(self, pod: str, containers: Sequence[Limits]) -> None:
        """Every call of ``pod``, container after container; stops at a refusal."""
        self.admitted[pod] = {c.container: set() for c in containers}
        later: list[AnyEvent] = []
        try:
            for container in containers:
                for resource, needed in container.limits:
                    self._call(pod, container.container, resource, needed, later)
        finally:
            self.events.extend(later)
            self._prune()

    def _known(self, table: DeviceTable) -> Knowledge:
        node = self.node
        asks = Asks(
            by_reservation={
                allocation.reservation_id: dict(allocation.resources)
                for allocation in node.pods.values()
                if allocation.resources
            },
            advertised=frozenset(self.tables),
        )
        listed = (
            [
                ListedPod("ns", name, {c: frozenset(r) for c, r in holding.items()})
                for name, holding in self.admitted.items()
            ]
            if self.lists_pods
            else None
        )
        return Knowledge(node, table, listed, asks, self.claimed, self.answered)

    def _call(
        self, pod: str, container: str, resource: str, needed: int, later: list[AnyEvent]
    ) -> None:
        table = self.tables[resource]
        held = self.held.setdefault(resource, set())
        free = [device for device, _ in table.devices() if device not in held]
        offered = offer_of(free, ())
        chosen = advise(
            self._known(table), available=free, must_include=(), size=needed, offered=offered
        )
        if chosen is None:
            chosen = fallback_ids(table, free, (), needed, offered=offered)
        advised = exactly(table, needed, (), chosen, free, offered=offered)
        taken = [device for device in advised if device not in held][:needed]
        chosen_set = set(taken)
        taken += [device for device in free if device not in chosen_set][: needed - len(taken)]
        outcome = allocation_for(self._known(table), taken)
        self.served.append(Served(pod, container, resource, advised, tuple(taken), outcome))
        if isinstance(outcome, NoMatch):
            raise AssertionError(f"{pod}/{container} {resource}: refused: {outcome.reason}")
        self.answered.add((outcome.allocation.reservation_id, container, resource))
        if isinstance(outcome, Match):
            self.claimed.add(outcome.claim)
            assigned = _assigned(outcome)
            (later if self.log_behind else self.events).append(assigned)
            self._prune()
        held.update(taken)
        self.admitted[pod][container].add(resource)

    def _prune(self) -> None:
        """As the agent does on each event: claims end once the fold shows them."""
        node = self.node
        self.claimed = {
            (a.reservation_id, s.container)
            for a in node.pods.values()
            for s in a.shares
            if s.container not in a.assigned and (a.reservation_id, s.container) in self.claimed
        }


def _assigned(match: Match) -> ContainerAssigned:
    return ContainerAssigned(
        id=f"assigned-{match.allocation.reservation_id}-{match.share.container}",
        at=T0,
        node=NODE,
        pod=match.allocation.pod,
        reservation_id=match.allocation.reservation_id,
        container=match.share.container,
        card_uuids=tuple(card.uuid for card in match.cards),
    )


def per_card(table: DeviceTable, devices: Sequence[str]) -> dict[str, int]:
    """Card UUID → how many of ``devices`` are on it."""
    return table.sort_by_card(devices).per_card


def check_served(calls: KubeletCalls) -> None:
    """Every call went to its own container, on the cards the log gave it, and no card's
    IDs went beyond what the log gives the containers on it."""
    node = calls.node
    pods = {allocation.pod.name: allocation for allocation in node.pods.values()}
    given: dict[tuple[str, str], int] = {}
    for call in calls.served:
        allocation = pods[call.pod]
        table = calls.tables[call.resource]
        shares = tuple(s for s in allocation.shares if s.container == call.container)
        demand = container_demand(call.resource, shares, table.by_uuid, table.memory_unit)
        where = f"{call.pod}/{call.container} on {call.resource}"
        assert per_card(table, call.advised) == demand, f"{where}: advised off its cards"
        assert per_card(table, call.taken) == demand, f"{where}: handed out off its cards"
        asked = allocation.resources.get(call.container, ())
        if keyed_resource(asked, frozenset(calls.tables)) == call.resource:
            assert isinstance(call.outcome, Match), f"{where}: {call.outcome}"
            assert call.outcome.share.container == call.container, where
            assert [c.uuid for c in call.outcome.cards] == [s.card_uuid for s in shares], where
        else:
            assert isinstance(call.outcome, CountOnly), f"{where}: {call.outcome}"
            assert call.outcome.container == call.container, where
            assert call.outcome.allocation.pod.name == call.pod, where
        for uuid, count in per_card(table, call.taken).items():
            given[call.resource, uuid] = given.get((call.resource, uuid), 0) + count
    for (resource, uuid), count in given.items():
        table = calls.tables[resource]
        logged = sum(
            container_demand(resource, (s,), table.by_uuid, table.memory_unit).get(uuid, 0)
            for allocation in node.pods.values()
            for s in allocation.shares
            if resource in allocation.resources.get(s.container, ())
        )
        assert count <= logged, f"{resource} on {uuid}: {count} IDs handed out, the log {logged}"
