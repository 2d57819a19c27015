"""What must hold once the system has settled, checked from the outside.

A chaos run (``tools.chaos``) or an auditor folds the whole allocation log afresh and
lists the pods the Kubernetes API holds, then asks:

* :func:`oversubscribed_cards`: does any card hold more memory or compute than it has
  (:func:`oversubscribed_memory`, :func:`oversubscribed_compute`), or any memory on a
  card the inventory does not list (:func:`unknown_cards`)?
* :func:`unallocated_pods`: is every bound, unfinished GPU pod backed by the live
  allocation its annotations name, on its node, with the same cards?
* :func:`orphaned_allocations`: does the log still hold memory for a pod that is gone or
  finished, for one bound elsewhere, or for one pod on two nodes?
* :func:`compare_inspections`: does a live service's view (``GET .../inspect``) equal
  the view of a replay of the log at the same sequence?

Pure: facts in, :class:`Violation` values out, each one readable on its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from gpushare.core.annotations import AllocationAnnotation, read_allocation
from gpushare.core.model import Card
from gpushare.core.pods import TERMINAL_PHASES
from gpushare.core.requests import SHARE_RESOURCES
from gpushare.core.state import ClusterState, NodeState, PodAllocation, memory_by_card
from gpushare.core.view import FULL_CORE


class PodFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the Kubernetes API says about one pod."""

    namespace: str
    name: str
    uid: str
    node: str | None = None
    """``spec.nodeName``: set once the pod is bound."""
    phase: str = "Pending"
    annotations: Mapping[str, str] = msgspec.field(default_factory=dict)
    asks_gpu: bool = True
    """It asks for a gpushare resource, so a binding must have come through gpushare."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def alive(self) -> bool:
        return self.phase not in TERMINAL_PHASES


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """The facts of a pod as the API serves it (a JSON object, camelCase keys)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    asked = {
        name
        for container in containers
        for kind in ("limits", "requests")
        for name in ((container.get("resources") or {}).get(kind) or {})
    }
    return PodFacts(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        node=spec.get("nodeName") or None,
        phase=(pod.get("status") or {}).get("phase") or "Pending",
        annotations=dict(meta.get("annotations") or {}),
        asks_gpu=bool(asked & SHARE_RESOURCES),
    )


class Violation(msgspec.Struct, frozen=True):
    """One broken invariant: which check, where (node, card or pod), and what was seen."""

    check: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.where}: {self.detail}"


def check_cluster(state: ClusterState, pods: list[PodFacts]) -> list[Violation]:
    """Every invariant between a fresh fold of the log and the API's pods."""
    return [
        *oversubscribed_cards(state),
        *unallocated_pods(state, pods),
        *orphaned_allocations(state, pods),
    ]


def oversubscribed_cards(state: ClusterState) -> list[Violation]:
    """Cards holding more memory or compute than they have, or shares on unknown cards."""
    return [*oversubscribed_memory(state), *oversubscribed_compute(state), *unknown_cards(state)]


def oversubscribed_memory(state: ClusterState) -> list[Violation]:
    """Cards of which the log holds more memory than they have."""
    found: list[Violation] = []
    for node in state.nodes.values():
        for card in node.cards:
            used = node.used_mib.get(card.uuid, 0)
            if used > card.memory_mib:
                detail = f"{used} MiB held of {card.memory_mib} MiB by {_holders(node, card.uuid)}"
                found.append(Violation("oversubscribed", _card_where(node, card), detail))
    return found


def oversubscribed_compute(state: ClusterState) -> list[Violation]:
    """Cards of which the log holds more than all the compute."""
    found: list[Violation] = []
    for node in state.nodes.values():
        for card in node.cards:
            core = node.used_core.get(card.uuid, 0)
            if core > FULL_CORE:
                detail = f"{core}% compute held of {FULL_CORE}% by {_holders(node, card.uuid)}"
                found.append(Violation("oversubscribed", _card_where(node, card), detail))
    return found


def unknown_cards(state: ClusterState) -> list[Violation]:
    """Memory the log holds on cards the node's inventory does not list."""
    found: list[Violation] = []
    for node in state.nodes.values():
        known = {card.uuid for card in node.cards}
        for uuid in sorted(set(node.used_mib) - known):
            detail = f"{node.used_mib[uuid]} MiB held on a card the inventory does not list"
            found.append(Violation("unknown card", f"{node.name} {uuid}", detail))
    return found


def _card_where(node: NodeState, card: Card) -> str:
    return f"{node.name} card {card.index} ({card.uuid})"


def _holders(node: NodeState, uuid: str) -> str:
    names = [
        f"{allocation.pod.key}({memory_by_card(allocation.shares)[uuid]})"
        for allocation in node.pods.values()
        if uuid in memory_by_card(allocation.shares)
    ]
    return ", ".join(sorted(names)) or "nobody in the log"


def unallocated_pods(state: ClusterState, pods: list[PodFacts]) -> list[Violation]:
    """Bound, unfinished GPU pods whose allocation the log does not hold as annotated."""
    found: list[Violation] = []
    for pod in pods:
        if pod.node is None or not pod.alive or not pod.asks_gpu:
            continue
        detail = _allocation_mismatch(state.node(pod.node), pod)
        if detail:
            found.append(Violation("unallocated", f"pod {pod.key} on {pod.node}", detail))
    return found


def _allocation_mismatch(node: NodeState, pod: PodFacts) -> str:
    """Why ``pod`` (bound to ``node``) is not backed by the log; empty when it is."""
    annotated = read_allocation(dict(pod.annotations))
    if annotated is None:
        return "bound without gpushare's allocation annotation"
    held = node.pods.get(pod.uid)
    if held is None:
        return f"annotated with {annotated.reservation}, but the log holds nothing for it here"
    if held.reservation_id != annotated.reservation:
        return f"annotated with {annotated.reservation}, the log holds {held.reservation_id}"
    if annotated.node != node.name:
        return f"annotated for node {annotated.node}"
    if not held.corrected and _annotated_memory(annotated) != memory_by_card(held.shares):
        return (
            f"annotated cards {_annotated_memory(annotated)} differ from the log's "
            f"{memory_by_card(held.shares)}"
        )
    return ""


def _annotated_memory(annotated: AllocationAnnotation) -> dict[str, int]:
    shares = [share for shares in annotated.containers.values() for share in shares]
    return memory_by_card(shares)


def orphaned_allocations(state: ClusterState, pods: list[PodFacts]) -> list[Violation]:
    """Allocations of pods that are gone or finished, bound elsewhere, or held twice."""
    by_uid = {pod.uid: pod for pod in pods}
    found: list[Violation] = []
    for node, allocation in _allocations(state):
        where = f"{allocation.pod.key} ({allocation.pod.uid}) on {node.name}"
        detail = _orphan_reason(node.name, allocation, by_uid.get(allocation.pod.uid))
        if detail:
            found.append(Violation("orphaned", where, detail))
    for uid, holders in sorted(state.pod_nodes.items()):
        if len(holders) > 1:
            detail = f"live allocations on {len(holders)} nodes: {', '.join(sorted(holders))}"
            found.append(Violation("duplicated", f"pod {uid}", detail))
    return found


def _allocations(state: ClusterState) -> Iterator[tuple[NodeState, PodAllocation]]:
    for name in sorted(state.nodes):
        node = state.nodes[name]
        for uid in sorted(node.pods):
            yield node, node.pods[uid]


def _orphan_reason(node: str, allocation: PodAllocation, pod: PodFacts | None) -> str:
    """Why the log should no longer (or not here) hold ``allocation``; empty when it should."""
    if pod is None:
        return f"{allocation.memory_mib} MiB held for a pod the API no longer has"
    if not pod.alive:
        return f"{allocation.memory_mib} MiB held for a pod that is {pod.phase}"
    if allocation.bound and pod.node != node:
        return f"bound here in the log, but the API has the pod on {pod.node or 'no node'}"
    return ""


def compare_inspections(
    live: Mapping[str, Any], replayed: Mapping[str, Any], name: str = "live"
) -> list[Violation]:
    """Where ``live`` (a service's ``GET .../inspect``) and ``replayed`` (the same view of
    a fresh fold at the same sequence) disagree. Inventory timing is not compared."""
    mine, theirs = _by_node(live), _by_node(replayed)
    found: list[Violation] = []
    for node in sorted(mine.keys() | theirs.keys()):
        ours, replay = mine.get(node, {}), theirs.get(node, {})
        for key in sorted(ours.keys() | replay.keys()):
            if ours.get(key) != replay.get(key):
                detail = f"{name} {ours.get(key)!r}, replay {replay.get(key)!r}"
                found.append(Violation("diverged", f"{node} {key}", detail))
    return found


def _by_node(inspection: Mapping[str, Any]) -> dict[str, dict[str, object]]:
    """Each node's comparable facts, flattened to ``{"card 0 used_mib": 4096, ...}``."""
    nodes: dict[str, dict[str, object]] = {}
    for node in inspection.get("nodes", []):
        facts: dict[str, object] = {
            "last_seq": node.get("last_seq"),
            "used_mib": node.get("used_mib"),
            "pod_count": node.get("pod_count"),
        }
        for card in node.get("devs", []):
            prefix = f"card {card.get('index')}"
            for key in ("uuid", "total_mib", "used_mib", "healthy", "containers"):
                facts[f"{prefix} {key}"] = card.get(key)
            facts[f"{prefix} pods"] = sorted(
                (pod["uid"], pod["mib"], pod["reservation_id"], pod["state"])
                for pod in card.get("pods", [])
            )
        nodes[str(node.get("name"))] = facts
    return nodes
