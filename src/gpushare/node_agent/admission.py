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
except exactly one: the pod being admitted. :func:`admitting_allocation` finds it. The
kubelet serves that pod's containers in spec order (init containers first) and each of
a container's resources once, in no set order; so the call is the one of the pod's first
container that asked R, to get its cards or only to count, and does not hold R's IDs yet
(:func:`~.matching.calls_to_come`). A container that asked R only to count (its cards
come with another resource) must have its call, and its IDs on its own cards, before a
later container keyed on R: the two calls may well be the same size. No guess about
creation order, bind order or batching is involved.

When the kubelet shows no such pod, or more than one (an older kubelet that lists
every pod of its pod manager; a pod whose only R container is an init container),
:func:`admitting_allocation` says so and the caller falls back to the order-based
guess of :mod:`.matching`, whose mistakes the pod-resources check corrects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from gpushare.core.state import NodeState, PodAllocation
from gpushare.node_agent.matching import (
    NO_CALLS,
    Asks,
    Call,
    Claim,
    PendingContainer,
    calls_to_come,
)


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
    """The container the call hands its cards (keyed on the resource); ``None`` when the
    call only counts (then :attr:`counting` is the container)."""
    counting: PendingContainer | None = None
    """The container whose call it is when that container asked the resource only to
    count (its IDs belong on its own cards too)."""


@dataclass(frozen=True)
class Unknown:
    """The kubelet's list does not single out one pod; ``reason`` says why."""

    reason: str
    waiting: int = 0
    """How many listed pods wait for the resource (0 also when nothing was listed)."""
    listed: bool = True
    """Whether the kubelet answered at all."""


def waiting_pods(
    node: NodeState,
    listed: Iterable[ListedPod],
    resource: str,
    asks: Asks,
    *,
    claimed: Set[Claim] = frozenset(),
    answered: Set[Call] = NO_CALLS,
) -> list[list[PendingContainer]]:
    """Per live allocation whose pod the kubelet lists still waiting for ``resource``, its
    calls on it still to come (never empty): a container the kubelet lists asked the
    resource and holds none of its IDs (says the kubelet), or an init container, which it
    never lists, asked it and has not had that call (says the log), before any later
    container started (:func:`~.matching.calls_to_come`).

    A pod name with several live allocations (a pod deleted and created again under the
    same name, the old one not released yet) is matched by its unfinished one.
    """
    by_key: dict[str, list[PodAllocation]] = {}
    for allocation in node.pods.values():
        by_key.setdefault(allocation.pod.key, []).append(allocation)
    found: list[list[PendingContainer]] = []
    for pod in listed:
        for allocation in by_key.get(pod.key, ()):
            coming = calls_to_come(
                allocation, resource, asks, claimed, answered=answered, holding=pod.holding
            )
            if coming:
                found.append(coming)
    return found


def admitting_allocation(
    node: NodeState,
    listed: Sequence[ListedPod] | None,
    resource: str,
    asks: Asks,
    claimed: Set[Claim],
    *,
    answered: Set[Call] = NO_CALLS,
) -> Admitting | Unknown:
    """The pod being admitted, if the kubelet's list singles out exactly one, and the
    container whose call on ``resource`` it is."""
    if listed is None:
        return Unknown("the kubelet's pod-resources API did not answer", listed=False)
    waiting = waiting_pods(node, listed, resource, asks, claimed=claimed, answered=answered)
    if len(waiting) != 1:
        names = ", ".join(sorted(coming[0].allocation.pod.key for coming in waiting)) or "none"
        return Unknown(f"{len(waiting)} listed pods wait for {resource} ({names})", len(waiting))
    call = waiting[0][0]
    if asks.keyed(*call.claim) == resource:
        return Admitting(call.allocation, call)
    return Admitting(call.allocation, None, call)
