"""Pods filter placed on a node that bind has not reserved yet: counted there meanwhile.

kube-scheduler assumes a pod on its node as soon as its scheduling cycle ends and binds it
while the next pods are scheduled, so a pod's reservation reaches the fold a few cycles
after its filter. Judged on the fold alone, the pods in between see the node as if it
were still free: a packing policy sends them to the same node, and the last ones find
their cards taken at bind, are refused, and go back to kube-scheduler's queue with a
back-off of a second or more. So the allocator remembers, per node, the pods its filter
answered that node alone for, and judges the next pods on the node with those placed,
as kube-scheduler judges its own resources with the pods it assumed, until the pod's
reservation folds or :data:`ASSUME_SECONDS` pass (its cycle failed after filter, or
another replica was asked to bind it).

Each pod is remembered with the cards filter planned it on, and both filter and bind keep
it there while those cards still hold it: the next pods are judged with it on those
cards, and bind reserves those cards. Planned afresh at each step, a pod could be placed
differently by its bind than the later pods were judged with (binds overtaking one
another, or the workload's policy rebuilt in between), and the last pod on a nearly full
node then found no card left at bind: refused, and back to kube-scheduler's queue with a
back-off (one pod in some ``bench-kube`` runs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import NamedTuple

from gpushare.core.events import AnyEvent, PodReserved
from gpushare.core.policies.base import Assignment
from gpushare.core.requests import PodRequest
from gpushare.core.state import NodeState

ASSUME_SECONDS = 10.0
"""How long a pod filter placed stays counted on its node without its reservation:
kube-scheduler asks bind right after the cycle (its extender ``httpTimeout`` bounds it)."""


class Assumed(NamedTuple):
    uid: str
    node: str
    request: PodRequest
    until: float
    """Monotonic seconds after which it no longer counts."""
    planned: Assignment | None = None
    """The cards filter planned the pod on (``None``: not known)."""


class AssumedPlacements:
    """Per node, the pods filter placed there and bind has not reserved yet."""

    def __init__(self, seconds: float = ASSUME_SECONDS) -> None:
        self.seconds = seconds
        self._by_pod: dict[str, Assumed] = {}
        self._by_node: dict[str, dict[str, Assumed]] = {}
        self._order: deque[Assumed] = deque()
        """Every entry ever assumed, oldest first: expired ones leave from the left."""

    def assume(
        self,
        uid: str,
        node: str,
        request: PodRequest,
        now: float,
        planned: Assignment | None = None,
    ) -> None:
        """``uid`` goes to ``node``, on the cards ``planned`` (a later filter of the same
        pod replaces it)."""
        self._expire(now)
        self.forget(uid)
        entry = Assumed(uid, node, request, now + self.seconds, planned)
        self._by_pod[uid] = entry
        self._by_node.setdefault(node, {})[uid] = entry
        self._order.append(entry)

    def forget(self, uid: str) -> None:
        entry = self._by_pod.pop(uid, None)
        if entry is None:
            return
        on_node = self._by_node[entry.node]
        del on_node[uid]
        if not on_node:
            del self._by_node[entry.node]

    def nodes(self) -> Collection[str]:
        """The nodes some pod is assumed on (expired ones may still be among them)."""
        return self._by_node.keys()

    def on(self, node: str, now: float, *, besides: str) -> list[Assumed]:
        """The pods placed on ``node`` and not reserved yet, oldest first, but for the pod
        ``besides`` (the one being judged)."""
        on_node = self._by_node.get(node)
        if not on_node:
            return []
        return [e for e in on_node.values() if e.uid != besides and e.until > now]

    def planned(self, uid: str, node: str, now: float) -> Assignment | None:
        """The cards filter planned ``uid`` on, if it placed the pod on ``node``."""
        entry = self._by_pod.get(uid)
        if entry is None or entry.node != node or entry.until <= now:
            return None
        return entry.planned

    def on_event(self, seq: int, event: AnyEvent, node: NodeState) -> None:
        """A follower listener: a pod's reservation folded, so the fold counts it now."""
        if isinstance(event, PodReserved):
            self.forget(event.pod.uid)

    def _expire(self, now: float) -> None:
        while self._order and self._order[0].until <= now:
            entry = self._order.popleft()
            if self._by_pod.get(entry.uid) is entry:
                self.forget(entry.uid)
