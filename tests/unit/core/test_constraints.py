"""A pod's own constraints against a node, as kube-scheduler's filters read them (tables from
upstream's semantics), and properties every answer keeps."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.constraints import (
    Node,
    NodeSelectorRequirement,
    Taint,
    Toleration,
    exclusion,
    label_requirement_holds,
    stated_preferences,
    tolerates,
    untolerated_taints,
)
from gpushare.core.pods import PodSpec, pod_from_dict

LABELS = {"kubernetes.io/hostname": "gpu-a", "gpu": "a100", "cards": "8", "zone": "z1"}


def node(
    name: str = "gpu-a",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
) -> Node:
    data = {
        "metadata": {"name": name, "labels": LABELS if labels is None else labels},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"capacity": {"cpu": "8"}},  # ignored
    }
    return msgspec.convert(data, Node)


def spec(**fields: Any) -> PodSpec:
    """A PodSpec decoded from its JSON (camelCase keys), as the API serves it."""
    return pod_from_dict({"spec": {"containers": [{"name": "c"}], **fields}}).spec


def requirement(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    return {"affinity": {"nodeAffinity": required}}


def rule_of(pod: PodSpec, on: Node) -> str | None:
    found = exclusion(pod, on)
    return None if found is None else found.rule


# --- the whole check -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"nodeName": "gpu-a"}, None),
        ({"nodeName": "gpu-b"}, "nodeName"),
        ({"nodeSelector": {}}, None),
        ({"nodeSelector": {"gpu": "a100", "zone": "z1"}}, None),
        ({"nodeSelector": {"gpu": "a100", "zone": "z2"}}, "nodeSelector"),
        ({"nodeSelector": {"kubernetes.io/hostname": "gpu-b"}}, "nodeSelector"),
        ({"nodeSelector": {"missing": ""}}, "nodeSelector"),
        (affinity({"matchExpressions": [requirement("gpu", "In", "v100", "a100")]}), None),
        (
            affinity({"matchExpressions": [requirement("gpu", "In", "v100")]}),
            "required node affinity",
        ),
        # terms are ORed, expressions within a term ANDed
        (
            affinity(
                {"matchExpressions": [requirement("gpu", "In", "v100")]},
                {"matchExpressions": [requirement("zone", "In", "z1")]},
            ),
            None,
        ),
        (
            affinity(
                {
                    "matchExpressions": [
                        requirement("gpu", "In", "a100"),
                        requirement("zone", "NotIn", "z1"),
                    ]
                }
            ),
            "required node affinity",
        ),
        (affinity({"matchFields": [requirement("metadata.name", "In", "gpu-a")]}), None),
        (
            affinity({"matchFields": [requirement("metadata.name", "NotIn", "gpu-a")]}),
            "required node affinity",
        ),
        # expressions and fields of one term both must hold
        (
            affinity(
                {
                    "matchExpressions": [requirement("gpu", "Exists")],
                    "matchFields": [requirement("metadata.name", "In", "gpu-b")],
                }
            ),
            "required node affinity",
        ),
        # an empty term, an empty term list, or a malformed term matches nothing
        (affinity({}), "required node affinity"),
        (affinity(), "required node affinity"),
        (
            affinity({"matchExpressions": [requirement("gpu", "Like", "a")]}),
            "required node affinity",
        ),
        (
            affinity({"matchFields": [requirement("metadata.uid", "In", "x")]}),
            "required node affinity",
        ),
        (
            affinity({"matchFields": [requirement("metadata.name", "Exists")]}),
            "required node affinity",
        ),
        # nodeAffinity without its required part, or only preferences: no constraint
        ({"affinity": {"nodeAffinity": {}}}, None),
        (
            {
                "affinity": {
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}
                }
            },
            None,
        ),
        # nodeSelector and affinity both apply
        (
            {
                "nodeSelector": {"zone": "z2"},
                **affinity({"matchExpressions": [requirement("gpu", "Exists")]}),
            },
            "nodeSelector",
        ),
    ],
)
def test_node_name_selector_and_affinity(fields: dict[str, Any], expected: str | None) -> None:
    assert rule_of(spec(**fields), node()) == expected


@pytest.mark.parametrize(
    ("operator", "values", "labels", "holds"),
    [
        ("In", ["a100"], LABELS, True),
        ("In", ["v100", "h100"], LABELS, False),
        ("In", ["a100"], {}, False),
        ("In", [], LABELS, None),
        ("NotIn", ["v100"], LABELS, True),
        ("NotIn", ["a100"], LABELS, False),
        ("NotIn", ["a100"], {}, True),  # an absent label is not in any set
        ("NotIn", [], LABELS, None),
        ("Exists", [], LABELS, True),
        ("Exists", [], {}, False),
        ("Exists", ["a100"], LABELS, None),
        ("DoesNotExist", [], LABELS, False),
        ("DoesNotExist", [], {}, True),
        ("DoesNotExist", ["x"], {}, None),
        ("Gt", ["7"], {"gpu": "8"}, True),
        ("Gt", ["8"], {"gpu": "8"}, False),
        ("Lt", ["9"], {"gpu": "8"}, True),
        ("Lt", ["8"], {"gpu": "8"}, False),
        ("Gt", ["-1"], {"gpu": "+0"}, True),
        ("Gt", ["1"], {}, False),
        ("Gt", ["1"], {"gpu": "a100"}, False),  # a label that is no integer never compares
        ("Gt", ["1"], {"gpu": " 8"}, False),  # nor one Go's ParseInt refuses
        ("Gt", ["1"], {"gpu": "1_000"}, False),
        ("Gt", ["1"], {"gpu": "9223372036854775808"}, False),  # past int64
        ("Gt", ["x"], {"gpu": "8"}, None),
        ("Gt", ["1", "2"], {"gpu": "8"}, None),
        ("Gt", [], {"gpu": "8"}, None),
        ("Near", ["a100"], LABELS, None),
    ],
)
def test_label_requirements(
    operator: str, values: list[str], labels: dict[str, str], holds: bool | None
) -> None:
    found = NodeSelectorRequirement(key="gpu", operator=operator, values=tuple(values))
    assert label_requirement_holds(found, labels) is holds


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (
            {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"},
            ("k", "v", "NoSchedule"),
            True,
        ),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            ("k", "v", "NoSchedule"),
            True,
        ),  # Equal is the default
        ({"key": "k", "value": "w", "effect": "NoSchedule"}, ("k", "v", "NoSchedule"), False),
        ({"key": "k", "value": "v", "effect": "NoExecute"}, ("k", "v", "NoSchedule"), False),
        ({"key": "k", "value": "v"}, ("k", "v", "NoExecute"), True),  # no effect: every effect
        ({"key": "k", "operator": "Exists"}, ("k", "anything", "NoSchedule"), True),
        ({"key": "k", "operator": "Exists", "value": ""}, ("k", "", "NoSchedule"), True),
        ({"key": "j", "operator": "Exists"}, ("k", "v", "NoSchedule"), False),
        ({"operator": "Exists"}, ("any", "thing", "NoExecute"), True),  # tolerates everything
        ({"operator": "Exists", "effect": "NoSchedule"}, ("any", "thing", "NoExecute"), False),
        ({"key": "k", "operator": "Gt", "value": "1"}, ("k", "2", "NoSchedule"), False),
        ({"key": "k", "value": ""}, ("k", "", "NoSchedule"), True),
    ],
)
def test_tolerations(
    toleration: dict[str, str], taint: tuple[str, str, str], tolerated: bool
) -> None:
    key, value, effect = taint
    held = msgspec.convert(toleration, Toleration)
    assert tolerates(held, Taint(key=key, value=value, effect=effect)) is tolerated


DEDICATED = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("taints", "tolerations", "unschedulable", "expected"),
    [
        ([DEDICATED], [], False, "tolerations"),
        ([DEDICATED], [{"key": "dedicated", "operator": "Exists"}], False, None),
        ([{**DEDICATED, "effect": "PreferNoSchedule"}], [], False, None),  # only scores
        ([{**DEDICATED, "effect": "NoExecute"}], [], False, "tolerations"),
        (
            [{**DEDICATED, "effect": "NoExecute"}],
            [{**DEDICATED, "effect": "NoExecute", "tolerationSeconds": 30}],
            False,
            None,
        ),
        ([DEDICATED, {"key": "gpu", "effect": "NoSchedule"}], [DEDICATED], False, "tolerations"),
        ([], [], True, "tolerations"),  # cordoned
        (
            [],
            [
                {
                    "key": "node.kubernetes.io/unschedulable",
                    "operator": "Exists",
                    "effect": "NoSchedule",
                }
            ],
            True,
            None,
        ),
    ],
)
def test_taints(
    taints: list[dict[str, Any]],
    tolerations: list[dict[str, Any]],
    unschedulable: bool,
    expected: str | None,
) -> None:
    on = node(taints=taints, unschedulable=unschedulable)
    assert rule_of(spec(tolerations=tolerations), on) == expected


def test_exclusions_say_what_failed() -> None:
    found = exclusion(spec(nodeSelector={"zone": "z2", "gpu": "a100"}), node())
    assert found is not None
    assert found.describe() == (
        "excluded by the pod's nodeSelector: the node lacks the label(s) zone=z2"
    )
    found = exclusion(spec(), node(taints=[DEDICATED, {"key": "bare", "effect": "NoExecute"}]))
    assert found is not None
    assert (
        found.detail == "the node has untolerated taint(s) dedicated=ml:NoSchedule, bare:NoExecute"
    )


def test_a_pod_decoded_from_the_api_keeps_its_constraints() -> None:
    pod = pod_from_dict(
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "c"}],
                "nodeSelector": {"gpu": "a100"},
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                **affinity({"matchFields": [requirement("metadata.name", "In", "gpu-a")]}),
            },
        }
    )
    assert pod.spec.node_selector == {"gpu": "a100"}
    assert pod.spec.tolerations == (Toleration(key="k", operator="Exists", effect="NoSchedule"),)
    assert exclusion(pod.spec, node()) is None
    assert rule_of(pod.spec, node("gpu-b")) == "required node affinity"


# --- properties -----------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "dedicated", "gpu", "node.kubernetes.io/unschedulable"])
VALUES = st.sampled_from(["", "x", "y", "1", "7"])
EFFECTS = st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])
taints = st.builds(Taint, key=KEYS, value=VALUES, effect=EFFECTS)
tolerations = st.builds(
    Toleration,
    key=st.one_of(st.just(""), KEYS),
    operator=st.sampled_from(["", "Equal", "Exists"]),
    value=VALUES,
    effect=st.one_of(st.just(""), EFFECTS),
)
label_maps = st.dictionaries(KEYS, VALUES, max_size=5)
nodes = st.builds(
    lambda labels, held, cordoned: node(
        "n", labels, [msgspec.to_builtins(t) for t in held], cordoned
    ),
    label_maps,
    st.lists(taints, max_size=4),
    st.booleans(),
)


@given(nodes, st.lists(tolerations, max_size=4), st.lists(tolerations, max_size=3))
def test_more_tolerations_never_exclude_more(
    on: Node, held: list[Toleration], more: list[Toleration]
) -> None:
    fewer = {(t.key, t.value, t.effect) for t in untolerated_taints(on, held)}
    after = {(t.key, t.value, t.effect) for t in untolerated_taints(on, [*held, *more])}
    assert after <= fewer


@given(nodes, st.lists(tolerations, max_size=4))
def test_a_pod_tolerating_everything_fits_any_node(on: Node, held: list[Toleration]) -> None:
    everything = [*held, Toleration(operator="Exists")]
    assert exclusion(spec(tolerations=[msgspec.to_builtins(t) for t in everything]), on) is None


@given(label_maps, st.data())
def test_a_node_selector_of_the_nodes_own_labels_admits_it(
    labels: dict[str, str], data: st.DataObject
) -> None:
    chosen = data.draw(
        st.lists(st.sampled_from(sorted(labels)), unique=True) if labels else st.just([])
    )
    on = node("n", labels)
    selector = {key: labels[key] for key in chosen}
    assert exclusion(spec(nodeSelector=selector), on) is None
    expressions = [requirement(key, "In", labels[key]) for key in chosen]
    if expressions:
        assert exclusion(spec(**affinity({"matchExpressions": expressions})), on) is None


@given(label_maps, KEYS, st.lists(VALUES, min_size=1, max_size=3))
def test_in_and_not_in_disagree_on_every_node(
    labels: dict[str, str], key: str, values: list[str]
) -> None:
    within = NodeSelectorRequirement(key=key, operator="In", values=tuple(values))
    outside = NodeSelectorRequirement(key=key, operator="NotIn", values=tuple(values))
    assert label_requirement_holds(within, labels) is not label_requirement_holds(outside, labels)


PREFERRED_TERM = [{"weight": 1, "preference": {"matchExpressions": []}}]


@pytest.mark.parametrize(
    ("spec", "stated"),
    [
        ({}, ()),
        ({"affinity": {}}, ()),
        (
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": []}]}}}},
            (),
        ),
        (
            {"affinity": {"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": PREFERRED_TERM}}},
            ("preferred node affinity",),
        ),
        (
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
            (),
        ),
        (
            {"affinity": {
                "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]},
            }},
            ("preferred pod affinity",),
        ),
        (
            {"affinity": {"podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{}]}}},
            ("preferred pod anti-affinity",),
        ),
        ({"topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule"}]}, ()),
        (
            {"topologySpreadConstraints": [
                {"whenUnsatisfiable": "DoNotSchedule"}, {"whenUnsatisfiable": "ScheduleAnyway"}
            ]},
            ("topology spread (ScheduleAnyway)",),
        ),
    ],
)  # fmt: skip
def test_stated_preferences_are_those_only_scores_weigh(
    spec: dict[str, Any], stated: tuple[str, ...]
) -> None:
    decoded = msgspec.convert({"containers": [], **spec}, PodSpec)
    assert stated_preferences(decoded.affinity, decoded.topology_spread_constraints) == stated
