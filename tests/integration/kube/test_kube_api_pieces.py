"""The stand-in's pure parts: patch dialects, selectors, paths, the store's revisions."""

from __future__ import annotations

import pytest

from gpushare.embedded.kube_patch import json_patch, merge_patch, strategic_merge_patch
from gpushare.embedded.kube_paths import parse_target
from gpushare.embedded.kube_selectors import selector
from gpushare.embedded.kube_status import StatusError
from gpushare.embedded.kube_store import ObjectStore


def test_merge_patch_is_rfc_7386() -> None:
    target = {"a": {"b": 1, "c": 2}, "list": [1, 2], "gone": 1}
    patch = {"a": {"c": None, "d": 3}, "list": [3], "gone": None}
    assert merge_patch(target, patch) == {"a": {"b": 1, "d": 3}, "list": [3]}
    assert target == {"a": {"b": 1, "c": 2}, "list": [1, 2], "gone": 1}


def test_strategic_merge_patch_merges_keyed_lists_and_honours_directives() -> None:
    target = {
        "spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]},
        "metadata": {"finalizers": ["x"]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }
    patch = {
        "spec": {
            "containers": [{"name": "b", "image": "2"}, {"name": "a", "$patch": "delete"}],
            "$setElementOrder/containers": [{"name": "b"}],
        },
        "metadata": {"finalizers": ["y", "x"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert strategic_merge_patch(target, patch) == {
        "spec": {"containers": [{"name": "b", "image": "2"}]},
        "metadata": {"finalizers": ["x", "y"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    replaced = strategic_merge_patch({"a": {"x": 1}}, {"a": {"$patch": "replace", "y": 2}})
    assert replaced == {"a": {"y": 2}}
    removed = strategic_merge_patch(
        {"metadata": {"finalizers": ["x", "y"]}},
        {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}},
    )
    assert removed == {"metadata": {"finalizers": ["y"]}}


def test_json_patch_operations_and_failed_test() -> None:
    target = {"metadata": {"annotations": {"a/b": "1"}}, "list": [1, 2]}
    patched = json_patch(
        target,
        [
            {"op": "test", "path": "/metadata/annotations/a~1b", "value": "1"},
            {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"},
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "remove", "path": "/list/0"},
            {"op": "copy", "from": "/list", "path": "/copy"},
        ],
    )
    assert patched == {"metadata": {"annotations": {"a/b": "2"}}, "list": [2, 3], "copy": [2, 3]}
    with pytest.raises(StatusError) as failed:
        json_patch(target, [{"op": "test", "path": "/list/0", "value": 9}])
    assert failed.value.code == 422


def test_selectors() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x", "tier": "gpu"}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    assert selector("pods", "app=x,tier in (gpu, cpu)", "spec.nodeName=n1")(pod)
    assert selector("pods", "app!=y,!missing", "status.phase!=Pending")(pod)
    assert not selector("pods", "app notin (x)", None)(pod)
    assert not selector("pods", None, "spec.nodeName=")(pod)
    with pytest.raises(StatusError) as unsupported:
        selector("nodes", None, "spec.nodeName=n1")
    assert unsupported.value.code == 400


def test_paths() -> None:
    assert parse_target("pods").resource.plural == "pods"
    namespaced = parse_target("namespaces/ns/pods/p/binding")
    assert (namespaced.namespace, namespaced.name, namespaced.subresource) == ("ns", "p", "binding")
    assert parse_target("namespaces/ns/bindings").legacy_binding
    assert parse_target("namespaces/ns").resource.plural == "namespaces"
    assert parse_target("nodes/n1/status").subresource == "status"
    for bad in ("widgets", "pods/p", "nodes/n1/binding", "namespaces/ns/pods/p/exec/x"):
        with pytest.raises(StatusError):
            parse_target(bad)


def test_store_revisions_and_compaction() -> None:
    store = ObjectStore(history_size=2)
    first = store.write("nodes", {"metadata": {"name": "a"}})
    second = store.write("nodes", {"metadata": {"name": "a", "labels": {"x": "1"}}})
    assert (first["metadata"]["resourceVersion"], second["metadata"]["resourceVersion"]) == (
        "1",
        "2",
    )
    assert [c.type for c in store.changes_since("nodes", 0)] == ["ADDED", "MODIFIED"]
    store.delete("nodes", "", "a")
    assert [c.type for c in store.changes_since("nodes", 1)] == ["MODIFIED", "DELETED"]
    with pytest.raises(StatusError) as gone:
        store.changes_since("nodes", 0)
    assert gone.value.code == 410
