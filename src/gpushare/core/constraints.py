"""Whether a pod's own scheduling constraints let it run on a node, as kube-scheduler reads them.

Bind re-checks the node kube-scheduler (or whoever called) names against the pod the API
holds, so a caller cannot place a pod where its spec forbids it. The rules are those of
kube-scheduler's in-tree filters, written from their upstream sources
(``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``, ``k8s.io/api/core/v1``
``Toleration.ToleratesTaint``, ``k8s.io/apimachinery/pkg/labels`` ``Requirement.Matches``):

* ``spec.nodeName``, when set, names the only node;
* ``spec.nodeSelector``: every pair must be one of the node's labels;
* required node affinity: one ``nodeSelectorTerms`` entry must match; within a term every
  ``matchExpressions`` (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt`` on
  labels) and every ``matchFields`` (``In``/``NotIn`` on ``metadata.name``) must hold. A
  term that is empty or malformed (unknown operator, wrong number of values, a ``Gt``
  value that is no integer) matches no node, as upstream ignores such a term;
* taints with effect ``NoSchedule`` or ``NoExecute`` must each be tolerated
  (``PreferNoSchedule`` only scores); a cordoned node (``spec.unschedulable``) counts as
  the ``node.kubernetes.io/unschedulable:NoSchedule`` taint, as the NodeUnschedulable
  filter does.

Label-key and label-value syntax is not validated: the API server refuses such a pod
before anything could ask to bind it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec

IN = "In"
NOT_IN = "NotIn"
EXISTS = "Exists"
DOES_NOT_EXIST = "DoesNotExist"
GT = "Gt"
LT = "Lt"
EQUAL = "Equal"

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
FILTERING_EFFECTS = frozenset({NO_SCHEDULE, NO_EXECUTE})
"""Taint effects that keep a pod off a node; ``PreferNoSchedule`` only lowers its score."""

SCHEDULE_ANYWAY = "ScheduleAnyway"
"""A topology spread constraint that only scores."""

NAME_FIELD = "metadata.name"
"""The one field ``matchFields`` may name."""
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

_INT64 = re.compile(r"^[+-]?[0-9]+$")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class NodeSelectorRequirement(msgspec.Struct, frozen=True, kw_only=True):
    key: str = ""
    operator: str = ""
    values: tuple[str, ...] | None = None


class NodeSelectorTerm(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    match_expressions: tuple[NodeSelectorRequirement, ...] | None = None
    match_fields: tuple[NodeSelectorRequirement, ...] | None = None


class NodeSelector(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    node_selector_terms: tuple[NodeSelectorTerm, ...] = ()


class WeightedTerm(msgspec.Struct, frozen=True, kw_only=True):
    """A preferred (anti-)affinity term: read only for being there; its term is skipped."""

    weight: int = 0


class NodeAffinity(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Only the required part filters."""
    preferred_during_scheduling_ignored_during_execution: tuple[WeightedTerm, ...] | None = None
    """Only scores (kube-scheduler's): read only for whether there is any."""


class PodAffinity(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Pod (anti-)affinity is about other pods, not the node's own facts: kube-scheduler's
    filters judge its required terms before the extender is asked; only whether there are
    preferred terms is read."""

    preferred_during_scheduling_ignored_during_execution: tuple[WeightedTerm, ...] | None = None


class Affinity(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class TopologySpreadConstraint(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    when_unsatisfiable: str = ""
    """``DoNotSchedule`` (a filter, kube-scheduler's) or ``ScheduleAnyway`` (a score)."""


class Toleration(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    key: str = ""
    operator: str = ""
    """``Equal`` (also when empty) or ``Exists``."""
    value: str = ""
    effect: str = ""
    """Empty tolerates every effect."""
    toleration_seconds: int | None = None


class Taint(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    value: str = ""
    effect: str = ""


class NodeMeta(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    labels: dict[str, str] | None = None


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    taints: tuple[Taint, ...] | None = None
    unschedulable: bool = False


class Node(msgspec.Struct, frozen=True, kw_only=True):
    """The parts of a Kubernetes Node that a pod's constraints read (decoded from its JSON;
    unknown fields are ignored)."""

    metadata: NodeMeta = NodeMeta()
    spec: NodeSpec = NodeSpec()

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def labels(self) -> Mapping[str, str]:
        return self.metadata.labels or {}

    @property
    def taints(self) -> tuple[Taint, ...]:
        """The node's taints, the cordon included as the taint the node controller adds."""
        taints = self.spec.taints or ()
        if self.spec.unschedulable and not any(
            t.key == UNSCHEDULABLE_TAINT and t.effect == NO_SCHEDULE for t in taints
        ):
            return (*taints, Taint(key=UNSCHEDULABLE_TAINT, effect=NO_SCHEDULE))
        return taints


class Placement(Protocol):
    """What a pod says about where it may run (``gpushare.core.pods.PodSpec`` has it)."""

    @property
    def node_name(self) -> str | None: ...

    @property
    def node_selector(self) -> Mapping[str, str] | None: ...

    @property
    def affinity(self) -> Affinity | None: ...

    @property
    def tolerations(self) -> Sequence[Toleration] | None: ...


class Exclusion(msgspec.Struct, frozen=True, kw_only=True):
    """Why a node is excluded: the rule (a short, stable name) and what failed."""

    rule: str
    detail: str

    def describe(self) -> str:
        return f"excluded by the pod's {self.rule}: {self.detail}"


# --- matching -----------------------------------------------------------------------


def _int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: digits with an optional sign, in range."""
    if not _INT64.match(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def label_requirement_holds(
    requirement: NodeSelectorRequirement, labels: Mapping[str, str]
) -> bool | None:
    """``requirement`` on ``labels``; ``None`` when it is malformed (it then matches nothing)."""
    operator, values = requirement.operator, requirement.values or ()
    present = requirement.key in labels
    value = labels.get(requirement.key, "")
    if operator in (IN, NOT_IN):
        if not values:
            return None
        return (present and value in values) is (operator == IN)
    if operator in (EXISTS, DOES_NOT_EXIST):
        if values:
            return None
        return present is (operator == EXISTS)
    if operator in (GT, LT):
        bound = _int64(values[0]) if len(values) == 1 else None
        if bound is None:
            return None
        have = _int64(value) if present else None
        if have is None:
            return False
        return have > bound if operator == GT else have < bound
    return None


def field_requirement_holds(requirement: NodeSelectorRequirement, node_name: str) -> bool | None:
    """A ``matchFields`` entry: only ``metadata.name`` with ``In``/``NotIn`` and one value."""
    values = requirement.values or ()
    if requirement.key != NAME_FIELD or requirement.operator not in (IN, NOT_IN):
        return None
    if len(values) != 1:
        return None
    return (node_name == values[0]) is (requirement.operator == IN)


def term_matches(term: NodeSelectorTerm, node: Node) -> bool:
    """Every expression and field of ``term`` holds; an empty or malformed term never does."""
    expressions, fields = term.match_expressions or (), term.match_fields or ()
    if not expressions and not fields:
        return False
    labels = node.labels
    for requirement in expressions:
        if label_requirement_holds(requirement, labels) is not True:
            return False
    return all(field_requirement_holds(f, node.name) is True for f in fields)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """``Toleration.ToleratesTaint``: an empty effect or key matches any; ``Exists``
    ignores the value; ``Equal`` (or no operator) compares it; other operators never match."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", EQUAL):
        return toleration.value == taint.value
    return toleration.operator == EXISTS


def required_affinity_matches(affinity: Affinity | None, node: Node) -> bool:
    """Some term of the required node affinity matches; true when the pod has none."""
    node_affinity = affinity.node_affinity if affinity else None
    if node_affinity is None:
        return True
    required = node_affinity.required_during_scheduling_ignored_during_execution
    if required is None:
        return True
    return any(term_matches(term, node) for term in required.node_selector_terms)


def untolerated_taints(node: Node, tolerations: Sequence[Toleration] | None) -> list[Taint]:
    """The node's NoSchedule/NoExecute taints that none of ``tolerations`` tolerates."""
    held = tolerations or ()
    return [
        taint
        for taint in node.taints
        if taint.effect in FILTERING_EFFECTS and not any(tolerates(t, taint) for t in held)
    ]


def _describe_taint(taint: Taint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


def _selector_mismatch(selector: Mapping[str, str], labels: Mapping[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in sorted(selector.items()) if labels.get(key) != value]


def stated_preferences(
    affinity: Affinity | None, spread: Sequence[TopologySpreadConstraint] | None
) -> tuple[str, ...]:
    """The preferences a pod's spec states that only kube-scheduler's scores weigh: the
    reason the extender leaves the choice among the nodes that fit to kube-scheduler.
    Empty when the spec states none."""
    stated: list[str] = []
    if affinity is not None:
        for name, part in (
            ("node affinity", affinity.node_affinity),
            ("pod affinity", affinity.pod_affinity),
            ("pod anti-affinity", affinity.pod_anti_affinity),
        ):
            if part is not None and part.preferred_during_scheduling_ignored_during_execution:
                stated.append(f"preferred {name}")
    if any(c.when_unsatisfiable == SCHEDULE_ANYWAY for c in spread or ()):
        stated.append("topology spread (ScheduleAnyway)")
    return tuple(stated)


def exclusion(pod: Placement, node: Node) -> Exclusion | None:
    """Why ``pod`` may not run on ``node``, or ``None`` when its constraints allow it."""
    if pod.node_name and pod.node_name != node.name:
        return Exclusion(rule="nodeName", detail=f"the pod names node {pod.node_name}")
    missing = _selector_mismatch(pod.node_selector or {}, node.labels)
    if missing:
        return Exclusion(
            rule="nodeSelector", detail=f"the node lacks the label(s) {', '.join(missing)}"
        )
    if not required_affinity_matches(pod.affinity, node):
        return Exclusion(
            rule="required node affinity",
            detail="no term of requiredDuringSchedulingIgnoredDuringExecution matches "
            "the node's labels and name",
        )
    untolerated = untolerated_taints(node, pod.tolerations)
    if untolerated:
        shown = ", ".join(_describe_taint(t) for t in untolerated)
        return Exclusion(rule="tolerations", detail=f"the node has untolerated taint(s) {shown}")
    return None
