"""The three PATCH dialects of the Kubernetes API, applied to plain JSON dicts.

* JSON merge patch (RFC 7386): maps merge, ``null`` deletes, lists are replaced.
* Strategic merge patch: merge patch, except that the lists Kubernetes declares with a
  merge key (containers by ``name``, conditions by ``type``...) merge element by element,
  and the ``$patch`` / ``$deleteFromPrimitiveList`` / ``$setElementOrder`` directives.
* JSON patch (RFC 6902): a list of operations; a failed ``test`` is a 422, as upstream.

Nothing here mutates its inputs.
"""

from __future__ import annotations

import copy
from typing import Any

from gpushare.embedded.kube_status import StatusError

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "taints": "key",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
"""Lists merged by key under strategic merge patch (their ``patchMergeKey`` upstream)."""

PRIMITIVE_SET_LISTS = frozenset({"finalizers"})
"""Lists of strings that strategic merge patch unions (``patchStrategy:"merge"``)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith(("$setElementOrder/", "$retainKeys", "$patch")):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [item for item in result.get(field) or [] if item not in value]
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    existing = list(current) if isinstance(current, list) else []
    if field in PRIMITIVE_SET_LISTS:
        return existing + [item for item in patch if item not in existing]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return copy.deepcopy(patch)
    for element in patch:
        position = next(
            (i for i, item in enumerate(existing) if item.get(key) == element.get(key)), None
        )
        if element.get("$patch") == "delete":
            if position is not None:
                del existing[position]
        elif position is None:
            existing.append({k: copy.deepcopy(v) for k, v in element.items() if k != "$patch"})
        else:
            existing[position] = strategic_merge_patch(existing[position], element)
    return existing


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise StatusError(422, f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(document: Any, parts: list[str]) -> tuple[Any, str]:
    node = document
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise StatusError(422, f"the path {'/'.join(parts)!r} does not exist")
    return node, parts[-1]


def _read(document: Any, parts: list[str]) -> Any:
    if not parts:
        return document
    parent, last = _parent(document, parts)
    try:
        return parent[int(last)] if isinstance(parent, list) else parent[last]
    except (KeyError, IndexError, ValueError):
        raise StatusError(422, f"the path /{'/'.join(parts)} does not exist") from None


def _remove(document: Any, parts: list[str]) -> Any:
    value = _read(document, parts)
    parent, last = _parent(document, parts)
    if isinstance(parent, list):
        del parent[int(last)]
    else:
        del parent[last]
    return value


def _add(document: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent, last = _parent(document, parts)
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        parent[last] = value
    return document


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902, on a deep copy of ``target``."""
    if not isinstance(operations, list):
        raise StatusError(400, "a JSON patch must be a list of operations")
    document = copy.deepcopy(target)
    for operation in operations:
        op, parts = operation.get("op"), _pointer(operation.get("path", ""))
        if op == "test":
            if _read(document, parts) != operation.get("value"):
                raise StatusError(422, f"the test operation on {operation['path']} failed")
        elif op == "remove":
            _remove(document, parts)
        elif op in {"add", "replace"}:
            if op == "replace":
                _remove(document, parts)
            document = _add(document, parts, copy.deepcopy(operation.get("value")))
        elif op in {"move", "copy"}:
            source = _pointer(operation.get("from", ""))
            value = _remove(document, source) if op == "move" else _read(document, source)
            document = _add(document, parts, copy.deepcopy(value))
        else:
            raise StatusError(422, f"unknown JSON patch operation {op!r}")
    return document


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    """Apply a PATCH body of ``content_type`` (the request's, parameters stripped)."""
    if content_type == JSON_PATCH:
        result = json_patch(target, patch)
    elif content_type == MERGE_PATCH:
        result = merge_patch(target, patch)
    elif content_type in {STRATEGIC_MERGE_PATCH, APPLY_PATCH}:
        # Server-side apply is approximated by a strategic merge: no field ownership.
        result = strategic_merge_patch(target, patch)
    else:
        raise StatusError(415, f"the body of the request was in an unknown format: {content_type}")
    if not isinstance(result, dict):
        raise StatusError(422, "the patch does not produce an object")
    return result
