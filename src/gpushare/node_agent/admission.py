"""Which pod the kubelet is admitting, read from the kubelet itself (pure).

The device plugin API never says which pod an ``Allocate`` is for. The kubelet's
pod-resources API does, indirectly, while the kubelet waits on us:

* the kubelet admits one pod at a time (``HandlePodAdditions`` runs admission in its
  sync loop; ``allocationManager.AddPod`` calls the device manager per container), and
  adds each pod to its pod manager just *before* admitting it;
* since v1.34 pod-resources ``List`` returns the pod manager's *active* pods
  (``KubeletPodResourcesListUseActivePods``, on by default): admitted pods that have
  not finished, and the pod being admitted; a pod refused at admission is Failed, so
  inactive, so not listed;
* the device manager records a container's device IDs only after its ``Allocate``
  returned, and keeps them for as long as the pod is active.

So while the kubelet is inside our ``GetPreferredAllocation`` or ``Allocate`` for
resource R, every listed pod holds IDs of R in each of its app containers that asked R,
except exactly one: the pod being admitted. :func:`admitting_allocation` finds it; the
container is that pod's first container still waiting for R's IDs, in the kubelet's
order (init containers, then the others, in spec order). No guess about creation
order, bind order or batching is involved.

When the kubelet shows no such pod, or more than one (an older kubelet that lists
every pod of its pod manager; a pod whose only R container is an init container),
:func:`admitting_allocation` says so and the caller falls back to the order-based
guess of :mod:`.matching`, whose mistakes the pod-resources check corrects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from gpushare.core.state import NodeState, PodAllocation
from gpushare.node_agent.matching import Asks, Claim, PendingContainer, containers_of


@dataclass(frozen=True)
class ListedPod:
    """A pod as pod-resources lists it: per app container, the resources it holds IDs of."""

    namespace: str
    name: str
    holding: Mapping[str, frozenset[str]]
    """Container name → the resources of which it holds at least one device ID."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Admitting:
    """The pod the kubelet is admitting, and the container it is asking for now."""

    allocation: PodAllocation
    container: PendingContainer | None
    """``None`` when every container of the pod that gets cards from this resource has
    them already (assigned in the log or claimed by this agent): the call is for a
    container that asked the resource only to count."""
    counting: PendingContainer | None = None
    """Then, that container: the first app container that asked the resource only to
    count and holds none of its IDs (its IDs belong on its own cards too)."""


@dataclass(frozen=True)
class Unknown:
    """The kubelet's list does not single out one pod; ``reason`` says why."""

    reason: str
    waiting: int = 0
    """How many listed pods wait for the resource (0 also when nothing was listed)."""
    listed: bool = True
    """Whether the kubelet answered at all."""


def asked(asks: Asks, reservation_id: str, container: str, resource: str) -> bool:
    """Whether the container asked ``resource``, to get cards from it or only to count."""
    return (
        resource in asks.names(reservation_id, container)
        or asks.keyed(reservation_id, container) == resource
    )


def _waits(allocation: PodAllocation, pod: ListedPod, resource: str, asks: Asks) -> bool:
    """Whether an app container of ``pod`` asked ``resource`` (says the log) and holds
    none of its IDs (says the kubelet)."""
    return any(
        share.container in pod.holding
        and resource not in pod.holding[share.container]
        and asked(asks, allocation.reservation_id, share.container, resource)
        for share in allocation.shares
        if not share.init
    )


def waiting_pods(
    node: NodeState, listed: Iterable[ListedPod], resource: str, asks: Asks
) -> list[PodAllocation]:
    """The live allocations whose pod the kubelet lists still waiting for ``resource``.

    A pod name with several live allocations (a pod deleted and created again under the
    same name, the old one not released yet) is matched by its unfinished one.
    """
    by_key: dict[str, list[PodAllocation]] = {}
    for allocation in node.pods.values():
        by_key.setdefault(allocation.pod.key, []).append(allocation)
    found: list[PodAllocation] = []
    for pod in listed:
        found.extend(
            allocation
            for allocation in by_key.get(pod.key, ())
            if _waits(allocation, pod, resource, asks)
        )
    return found


def next_container(
    allocation: PodAllocation, resource: str, asks: Asks, claimed: Set[Claim]
) -> PendingContainer | None:
    """The pod's first container that gets cards from ``resource`` and has none yet."""
    for position, shares in containers_of(allocation.shares):
        name = shares[0].container
        if name in allocation.assigned or (allocation.reservation_id, name) in claimed:
            continue
        if asks.keyed(allocation.reservation_id, name) == resource:
            return PendingContainer(allocation=allocation, shares=shares, position=position)
    return None


def counting_container(
    allocation: PodAllocation, pod: ListedPod, resource: str, asks: Asks
) -> PendingContainer | None:
    """The pod's first app container that asked ``resource`` besides the one that gives
    it its cards, and that the kubelet lists without ``resource``'s IDs."""
    for position, shares in containers_of(allocation.shares):
        name = shares[0].container
        if shares[0].init or resource in pod.holding.get(name, {resource}):
            continue
        rid = allocation.reservation_id
        if resource in asks.names(rid, name) and asks.keyed(rid, name) != resource:
            return PendingContainer(allocation=allocation, shares=shares, position=position)
    return None


def admitting_allocation(
    node: NodeState,
    listed: Sequence[ListedPod] | None,
    resource: str,
    asks: Asks,
    claimed: Set[Claim],
) -> Admitting | Unknown:
    """The pod being admitted, if the kubelet's list singles out exactly one."""
    if listed is None:
        return Unknown("the kubelet's pod-resources API did not answer", listed=False)
    waiting = waiting_pods(node, listed, resource, asks)
    if len(waiting) != 1:
        names = ", ".join(sorted(a.pod.key for a in waiting)) or "none"
        return Unknown(f"{len(waiting)} listed pods wait for {resource} ({names})", len(waiting))
    allocation = waiting[0]
    container = next_container(allocation, resource, asks, claimed)
    if container is not None:
        return Admitting(allocation, container)
    pod = next(p for p in listed if p.key == allocation.pod.key)
    again = readmitted_container(allocation, pod, resource, asks)
    if again is not None:
        return Admitting(allocation, again)
    return Admitting(allocation, None, counting_container(allocation, pod, resource, asks))


def readmitted_container(
    allocation: PodAllocation, pod: ListedPod, resource: str, asks: Asks
) -> PendingContainer | None:
    """A container the log has assigned that the kubelet lists without ``resource``'s
    IDs: the kubelet is admitting the pod again (it restarted before its device
    checkpoint held them, so it allocates afresh). It gets its own cards again."""
    for position, shares in containers_of(allocation.shares):
        name = shares[0].container
        if shares[0].init or name not in allocation.assigned:
            continue
        if asks.keyed(allocation.reservation_id, name) != resource:
            continue
        if resource not in pod.holding.get(name, {resource}):
            return PendingContainer(allocation=allocation, shares=shares, position=position)
    return None
