"""Seed 002's ``kubernetes.io/gpu*`` names renamed to gpushare's: the JSON Patch, as a table of
seed 002's worked requests, and as properties (applied with ``jsonpatch``, RFC 6902)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.errors import InvalidRequest
from gpushare.core.native_names import (
    RENAMES,
    REWRITTEN_ANNOTATION,
    Rewrite,
    pointer,
    rewrite_native_names,
)
from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import PodRequest, validate_pod

Obj = dict[str, Any]
C0 = "/spec/containers/0/resources"


def pod(
    *containers: Obj, init: list[Obj] | None = None, annotations: dict[str, str] | None = None
) -> Obj:
    """A pod as the kube-apiserver hands it to admission, containers ``c0, c1, ...``."""
    metadata: Obj = {"name": "p", "namespace": "default"}
    if annotations is not None:
        metadata["annotations"] = annotations
    spec: Obj = {
        "containers": [
            {"name": f"c{i}", "image": "x", "resources": resources}
            for i, resources in enumerate(containers)
        ]
    }
    if init is not None:
        spec["initContainers"] = [
            {"name": f"i{i}", "image": "x", "resources": resources}
            for i, resources in enumerate(init)
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def ops(rewrite: Rewrite) -> list[Obj]:
    return [msgspec.to_builtins(operation) for operation in rewrite.patch]


def applied(data: Obj) -> Obj:
    """The pod with its rewrite applied, as the kube-apiserver applies a webhook's patch."""
    result: Obj = jsonpatch.apply_patch(data, ops(rewrite_native_names(data)))
    return result


def move(section: str, old: str, new: str, at: str = C0) -> Obj:
    return {"op": "move", "from": f"{at}/{section}/{old}", "path": f"{at}/{section}/{new}"}


def annotated(value: str) -> Obj:
    return {"op": "add", "path": "/metadata/annotations", "value": {REWRITTEN_ANNOTATION: value}}


GPU, GPUSHARE_GPU = "kubernetes.io~1gpu", "gpushare.io~1gpu"
RATIO, GPUSHARE_RATIO = "kubernetes.io~1gpu-memory-ratio", "gpushare.io~1gpu-memory-ratio"


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param(
            # Seed 002, "Apply whole resources of GPU or part resources of GPU": requests only.
            {"requests": {"kubernetes.io/gpu": "50", "cpu": "4", "memory": "8Gi"}},
            [
                move("requests", GPU, GPUSHARE_GPU),
                {"op": "add", "path": f"{C0}/limits", "value": {}},
                {
                    "op": "copy",
                    "from": f"{C0}/requests/{GPUSHARE_GPU}",
                    "path": f"{C0}/limits/{GPUSHARE_GPU}",
                },
                annotated("kubernetes.io/gpu"),
            ],
            id="seed-002-gpu-requests-only",
        ),
        pytest.param(
            {"limits": {"kubernetes.io/gpu": "50"}, "requests": {"kubernetes.io/gpu": "50"}},
            [
                move("limits", GPU, GPUSHARE_GPU),
                move("requests", GPU, GPUSHARE_GPU),
                annotated("kubernetes.io/gpu"),
            ],
            id="limits-and-requests",
        ),
        pytest.param(
            {"limits": {"kubernetes.io/gpu-core": "50", "kubernetes.io/gpu-memory": "4Gi"}},
            [
                move("limits", "kubernetes.io~1gpu-core", "gpushare.io~1gpu-core"),
                move("limits", "kubernetes.io~1gpu-memory", "gpushare.io~1gpu-memory"),
                annotated("kubernetes.io/gpu-core,kubernetes.io/gpu-memory"),
            ],
            id="seed-002-core-and-memory-limits-only",
        ),
        pytest.param(
            # Seed 002, core and memory ratio separately; a limit exists for another resource.
            {
                "limits": {"cpu": "4"},
                "requests": {
                    "kubernetes.io/gpu-memory-ratio": "60",
                    "kubernetes.io/gpu-core": "50",
                },
            },
            [
                move("requests", "kubernetes.io~1gpu-core", "gpushare.io~1gpu-core"),
                {
                    "op": "copy",
                    "from": f"{C0}/requests/gpushare.io~1gpu-core",
                    "path": f"{C0}/limits/gpushare.io~1gpu-core",
                },
                move("requests", RATIO, GPUSHARE_RATIO),
                {
                    "op": "copy",
                    "from": f"{C0}/requests/{GPUSHARE_RATIO}",
                    "path": f"{C0}/limits/{GPUSHARE_RATIO}",
                },
                annotated("kubernetes.io/gpu-core,kubernetes.io/gpu-memory-ratio"),
            ],
            id="seed-002-core-and-ratio-requests-only",
        ),
        pytest.param(
            {"limits": {"kubernetes.io/gpu": "50", "gpushare.io/gpu": "50"}}, [], id="both-names"
        ),
        pytest.param(
            {"limits": {"kubernetes.io/gpu": "50"}, "requests": {"gpushare.io/gpu": "50"}},
            [],
            id="both-names-across-limits-and-requests",
        ),
        pytest.param({"limits": {"aliyun.com/gpu-mem": "1024"}}, [], id="aliyun"),
        pytest.param({"limits": {"gpushare.io/gpu": "50"}}, [], id="gpushare-already"),
        pytest.param({}, [], id="no-resources"),
        pytest.param({"limits": None, "requests": None}, [], id="null-resources"),
        pytest.param({"limits": {"kubernetes.io/rdma": "100"}}, [], id="seed-002-rdma"),
    ],
)
def test_one_container(resources: Obj, expected: list[Obj]) -> None:
    assert ops(rewrite_native_names(pod(resources))) == expected


def test_a_name_kept_beside_its_new_name_leaves_the_others_renamed() -> None:
    data = pod(
        {"limits": {"kubernetes.io/gpu-core": "50", "gpushare.io/gpu-core": "50"}},
        {"limits": {"kubernetes.io/gpu-core": "30"}},
    )
    rewrite = rewrite_native_names(data)
    at = "/spec/containers/1/resources"
    assert ops(rewrite) == [
        move("limits", "kubernetes.io~1gpu-core", "gpushare.io~1gpu-core", at),
        annotated("kubernetes.io/gpu-core"),
    ]
    assert [(a.container, a.name) for a in rewrite.renamed] == [("c1", "kubernetes.io/gpu-core")]
    assert [(a.container, a.name) for a in rewrite.kept] == [("c0", "kubernetes.io/gpu-core")]
    assert [a.describe() for a in rewrite.kept] == [
        "container 'c0': kubernetes.io/gpu-core -> gpushare.io/gpu-core"
    ]


def test_init_containers_are_renamed_at_their_own_path() -> None:
    data = pod({"limits": {"cpu": "1"}}, init=[{}, {"limits": {"kubernetes.io/gpu": "100"}}])
    rewrite = rewrite_native_names(data)
    assert ops(rewrite) == [
        move("limits", GPU, GPUSHARE_GPU, "/spec/initContainers/1/resources"),
        annotated("kubernetes.io/gpu"),
    ]
    assert [a.describe() for a in rewrite.renamed] == [
        "init container 'i1': kubernetes.io/gpu -> gpushare.io/gpu"
    ]


def test_existing_annotations_get_one_more() -> None:
    data = pod({"limits": {"kubernetes.io/gpu": "50"}}, annotations={"a/b": "c"})
    assert ops(rewrite_native_names(data))[-1] == {
        "op": "add",
        "path": "/metadata/annotations/gpushare.io~1rewritten-resources",
        "value": "kubernetes.io/gpu",
    }
    assert applied(data)["metadata"]["annotations"] == {
        "a/b": "c",
        REWRITTEN_ANNOTATION: "kubernetes.io/gpu",
    }


def test_a_pod_and_its_dict_give_the_same_rewrite() -> None:
    data = pod({"requests": {"kubernetes.io/gpu": "50"}}, init=[{"limits": {"cpu": "1"}}])
    assert rewrite_native_names(pod_from_dict(data)) == rewrite_native_names(data)


def test_json_pointer_escapes_tilde_and_slash() -> None:
    assert pointer("metadata", "annotations", "a~b/c", 0) == "/metadata/annotations/a~0b~1c/0"


def test_the_seed_002_pod_rewritten_comes_out_as_gpushare_asks_it() -> None:
    """Applied, the patch gives the pod gpushare serves: same values, new names, limits."""
    data = pod({"requests": {"kubernetes.io/gpu": "50", "cpu": "4", "memory": "8Gi"}})
    container = applied(data)["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"gpushare.io/gpu": "50", "cpu": "4", "memory": "8Gi"},
        "limits": {"gpushare.io/gpu": "50"},
    }


@pytest.mark.parametrize(
    "resources",
    [
        {"kubernetes.io/gpu": "50"},
        {"kubernetes.io/gpu-core": "50", "kubernetes.io/gpu-memory-ratio": "60"},
        {"kubernetes.io/gpu-core": "60", "kubernetes.io/gpu-memory": "4Gi"},
        {"kubernetes.io/gpu-memory-ratio": "200"},
    ],
)
def test_the_rewritten_pod_asks_what_the_original_asked(resources: dict[str, str]) -> None:
    """The rewrite asks the same under gpushare's names; not rewritten, the pod is refused
    with the rule that says so (nothing would serve it)."""
    data = pod({"limits": dict(resources), "requests": dict(resources)})
    before = validate_pod(pod_from_dict(data))
    assert isinstance(before, InvalidRequest)
    assert before.rule == "kubernetes-io-names-need-the-mutating-webhook"
    renamed = {RENAMES[name]: value for name, value in resources.items()}
    expected = validate_pod(pod_from_dict(pod({"limits": renamed, "requests": renamed})))
    after = validate_pod(pod_from_dict(applied(data)))
    assert isinstance(after, PodRequest)
    assert after == expected


# --- properties --------------------------------------------------------------------------

NAMES = [*RENAMES, *RENAMES.values(), "cpu", "memory", "aliyun.com/gpu-mem"]
quantities = st.sampled_from(["50", "100", "4Gi", "0.5", "1e3", 7])
sections = st.none() | st.dictionaries(st.sampled_from(NAMES), quantities, max_size=5)
resources = st.fixed_dictionaries({}, optional={"limits": sections, "requests": sections})
containers = st.lists(resources, min_size=1, max_size=3)
pods = st.builds(
    lambda main, init, annotations: pod(*main, init=init, annotations=annotations),
    containers,
    st.none() | st.lists(resources, max_size=2),
    st.none() | st.dictionaries(st.sampled_from(["a", REWRITTEN_ANNOTATION]), st.just("x")),
)


def _sections(container: Obj) -> tuple[Obj, Obj]:
    given_resources = container.get("resources") or {}
    return given_resources.get("limits") or {}, given_resources.get("requests") or {}


def _all_containers(data: Obj) -> list[Obj]:
    spec = data["spec"]
    found: list[Obj] = spec["containers"] + (spec.get("initContainers") or [])
    return found


@given(pods)
def test_renamed_values_are_unchanged_and_no_native_name_is_left_alone(data: Obj) -> None:
    original = copy.deepcopy(data)
    result = applied(data)
    assert data == original  # the rewrite reads the pod, never changes it
    for before, after in zip(_all_containers(original), _all_containers(result), strict=True):
        limits, requests = _sections(before)
        new_limits, new_requests = _sections(after)
        asked = set(limits) | set(requests)
        for old, new in RENAMES.items():
            if old not in asked or new in asked:  # nothing to rename, or both names: kept
                assert (new_limits.get(old), new_requests.get(old)) == (
                    limits.get(old),
                    requests.get(old),
                )
                continue
            assert old not in new_limits
            assert old not in new_requests
            assert new_requests.get(new) == requests.get(old)
            # A request without a limit gets it as its limit.
            assert new_limits[new] == limits.get(old, requests.get(old))
        untouched = set(NAMES) - set(RENAMES) - set(RENAMES.values())
        for name in untouched:
            assert (new_limits.get(name), new_requests.get(name)) == (
                limits.get(name),
                requests.get(name),
            )


@given(pods)
def test_the_rewrite_is_idempotent_and_annotated_when_it_renames(data: Obj) -> None:
    rewrite = rewrite_native_names(data)
    result = applied(data)
    assert rewrite_native_names(result).patch == ()
    annotations = result["metadata"].get("annotations") or {}
    if rewrite.renamed:
        names = {asked.name for asked in rewrite.renamed}
        assert annotations[REWRITTEN_ANNOTATION].split(",") == [n for n in RENAMES if n in names]
    else:
        assert rewrite.patch == ()
        assert result == data
