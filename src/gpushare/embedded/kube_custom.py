"""Custom resources in the stand-in: CRDs, and the resources they define under ``/apis``.

``POST /apis/apiextensions.k8s.io/v1/customresourcedefinitions`` stores a CRD and marks
it ``Established``; from then on its resource is served at
``/apis/<group>/<version>/[namespaces/<ns>/]<plural>[/<name>[/status]]`` with the same
CRUD, patch, watch and resourceVersion handling as the core resources. What the
apiextensions server does on the way into storage is mirrored here
(``pkg/registry/customresource/strategy.go``):

* with a ``status`` subresource, a create drops ``status`` and an update of the main
  resource keeps the stored one (``/status`` keeps everything else);
* ``metadata.generation`` starts at 1 and moves when anything but metadata and status
  changes;
* fields the version's ``openAPIV3Schema`` does not name are pruned (unless
  ``x-kubernetes-preserve-unknown-fields``), and values of the wrong type, missing
  required fields, values outside an ``enum`` or below a ``minimum`` are a 422.

The CRDs are looked up in the store on each request, so deleting one (which deletes its
objects) takes its resource away at once.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from gpushare.embedded.kube_objects import Resource
from gpushare.embedded.kube_paths import Target
from gpushare.embedded.kube_status import StatusError, invalid
from gpushare.embedded.kube_store import ObjectStore

APIEXTENSIONS = "apiextensions.k8s.io"
CRDS = Resource(
    f"customresourcedefinitions.{APIEXTENSIONS}",
    "CustomResourceDefinition",
    False,
    frozenset({"status"}),
    group=APIEXTENSIONS,
    version="v1",
)
ROOT_FIELDS = ("apiVersion", "kind", "metadata")
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def _not_found() -> StatusError:
    return StatusError(404, "the server could not find the requested resource")


def definitions(store: ObjectStore) -> list[dict[str, Any]]:
    return store.objects_of(CRDS.plural)


def _served(crd: dict[str, Any], version: str) -> dict[str, Any] | None:
    for entry in crd.get("spec", {}).get("versions") or []:
        if entry.get("name") == version and entry.get("served", True):
            found: dict[str, Any] = entry
            return found
    return None


def resource_of(crd: dict[str, Any], version: str) -> Resource:
    spec = crd["spec"]
    subresources = (_served(crd, version) or {}).get("subresources") or {}
    return Resource(
        f"{spec['names']['plural']}.{spec['group']}",
        spec["names"]["kind"],
        spec.get("scope") == "Namespaced",
        frozenset(name for name in ("status",) if name in subresources),
        group=spec["group"],
        version=version,
    )


def find_resource(store: ObjectStore, group: str, version: str, plural: str) -> Resource | None:
    if (group, version, plural) == (APIEXTENSIONS, "v1", "customresourcedefinitions"):
        return CRDS
    for crd in definitions(store):
        spec = crd.get("spec") or {}
        named = spec.get("group") == group and spec.get("names", {}).get("plural") == plural
        if named and _served(crd, version) is not None:
            return resource_of(crd, version)
    return None


def parse_group_target(store: ObjectStore, parts: list[str]) -> Target:
    """``parts`` is the path after ``/apis/``, split: group, version, then the rest."""
    group, version, rest = parts[0], parts[1], parts[2:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        candidate = find_resource(store, group, version, rest[2])
        if candidate is not None and candidate.namespaced:
            namespace, rest = rest[1], rest[2:]
    resource = find_resource(store, group, version, rest[0])
    if (
        resource is None
        or len(rest) > 3
        or (resource.namespaced and not namespace and len(rest) > 1)
    ):
        raise _not_found()
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if subresource and subresource not in resource.subresources:
        raise _not_found()
    return Target(resource, namespace, name, subresource)


def schema_of(store: ObjectStore, resource: Resource) -> dict[str, Any] | None:
    for crd in definitions(store):
        if resource_of(crd, resource.version).plural == resource.plural:
            entry = _served(crd, resource.version) or {}
            schema: dict[str, Any] | None = (entry.get("schema") or {}).get("openAPIV3Schema")
            return schema
    return None


# --- the strategy ------------------------------------------------------------------------


def prepare_custom_create(
    store: ObjectStore, resource: Resource, obj: dict[str, Any]
) -> dict[str, Any]:
    """``obj`` as stored by a POST, after :func:`kube_objects.prepare_create`."""
    if resource is CRDS:
        return _established(obj)
    if "status" in resource.subresources:
        obj.pop("status", None)
    obj["metadata"]["generation"] = 1
    return _checked(store, resource, obj)


def prepare_custom_update(
    store: ObjectStore, resource: Resource, old: dict[str, Any], new: dict[str, Any], sub: str
) -> dict[str, Any]:
    """``new`` as stored by a PUT or PATCH, after :func:`kube_objects.prepare_update`."""
    if resource is CRDS:
        _check_crd(new)
        return dict(new, status=copy.deepcopy(old.get("status") or {}))
    if "status" in resource.subresources and not sub:
        new.pop("status", None)
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
    generation = old["metadata"].get("generation", 1)
    if _spec_of(old) != _spec_of(new):
        generation += 1
    new["metadata"]["generation"] = generation
    return _checked(store, resource, new)


def _spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key not in (*ROOT_FIELDS, "status")}


def _checked(store: ObjectStore, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    schema = schema_of(store, resource)
    if schema is None:
        return obj
    kind = f"{resource.kind}.{resource.group}"
    name = obj["metadata"].get("name", "")
    pruned = {key: obj[key] for key in ROOT_FIELDS if key in obj}
    body = {key: value for key, value in obj.items() if key not in ROOT_FIELDS}
    problems: list[tuple[str, str]] = []
    rest = _walk(body, {**schema, "properties": _without_root(schema)}, "", problems)
    if problems:
        field, problem = problems[0]
        raise invalid(kind, name, field, problem)
    pruned.update(rest)
    return pruned


def _without_root(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (schema.get("properties") or {}).items() if k not in ROOT_FIELDS}


def _walk(value: Any, schema: dict[str, Any], path: str, problems: list[tuple[str, str]]) -> Any:
    """``value`` pruned to ``schema``; what is wrong with it goes to ``problems``."""
    expected = schema.get("type")
    allowed = _TYPES.get(expected or "", (object,))
    if value is None and schema.get("nullable"):
        return None
    if not isinstance(value, allowed) or (
        isinstance(value, bool) and expected in ("integer", "number")
    ):
        problems.append((path or "<root>", f"Invalid value: must be of type {expected}"))
        return value
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(f'"{choice}"' for choice in schema["enum"])
        problems.append((path, f'Unsupported value: "{value}": supported values: {choices}'))
    if "minimum" in schema and isinstance(value, int | float) and value < schema["minimum"]:
        problems.append((path, f"Invalid value: {value}: should be >= {schema['minimum']}"))
    if isinstance(value, list) and "items" in schema:
        return [
            _walk(item, schema["items"], f"{path}[{i}]", problems) for i, item in enumerate(value)
        ]
    if isinstance(value, dict):
        return _walk_object(value, schema, path, problems)
    return value


def _walk_object(
    value: dict[str, Any], schema: dict[str, Any], path: str, problems: list[tuple[str, str]]
) -> dict[str, Any]:
    prefix = f"{path}." if path else ""
    for field in schema.get("required") or []:
        if field not in value:
            problems.append((f"{prefix}{field}", "Required value"))
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return {k: _walk(v, extra, f"{prefix}{k}", problems) for k, v in value.items()}
    if properties is None or schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    return {
        key: _walk(item, properties[key], f"{prefix}{key}", problems)
        for key, item in value.items()
        if key in properties
    }


# --- CRDs themselves ---------------------------------------------------------------------


def _check_crd(crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    for field, value in (
        ("spec.group", spec.get("group")),
        ("spec.names.plural", names.get("plural")),
        ("spec.names.kind", names.get("kind")),
        ("spec.versions", spec.get("versions")),
    ):
        if not value:
            raise invalid(CRDS.kind, name, field, "Required value")
    if spec.get("scope") not in ("Cluster", "Namespaced"):
        raise invalid(
            CRDS.kind, name, "spec.scope", 'Unsupported value: must be "Cluster" or "Namespaced"'
        )
    if name != f"{names['plural']}.{spec['group']}":
        raise invalid(
            CRDS.kind,
            name,
            "metadata.name",
            'Invalid value: must be spec.names.plural+"."+spec.group',
        )


def _established(crd: dict[str, Any]) -> dict[str, Any]:
    _check_crd(crd)
    names = crd["spec"]["names"]
    accepted = {"listKind": f"{names['kind']}List", "singular": names["kind"].lower(), **names}
    crd["metadata"]["generation"] = 1
    crd["status"] = {
        "acceptedNames": accepted,
        "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
        ],
    }
    return crd


def forget_objects(store: ObjectStore, crd: dict[str, Any]) -> None:
    """Deleting a CRD deletes every object of its resource."""
    plural = f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"
    for resource, namespace, name in list(store.objects):
        if resource == plural:
            store.delete(resource, namespace, name)


# --- discovery ---------------------------------------------------------------------------


def api_groups(store: ObjectStore) -> dict[str, Any]:
    """``/apis``: apiextensions and every group a CRD defines."""
    versions: dict[str, list[str]] = {APIEXTENSIONS: ["v1"]}
    for crd in definitions(store):
        spec = crd["spec"]
        served = [v["name"] for v in spec["versions"] if v.get("served", True)]
        versions.setdefault(spec["group"], [])
        versions[spec["group"]] += [v for v in served if v not in versions[spec["group"]]]
    groups = []
    for group, names in sorted(versions.items()):
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in names]
        groups.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group_discovery(store: ObjectStore, parts: list[str]) -> dict[str, Any]:
    """``/apis/<group>`` (an APIGroup) or ``/apis/<group>/<version>`` (its resources)."""
    groups = {entry["name"]: entry for entry in api_groups(store)["groups"]}
    group = groups.get(parts[0])
    if group is None:
        raise _not_found()
    if len(parts) == 1:
        return {"kind": "APIGroup", "apiVersion": "v1", **group}
    version = parts[1]
    if version not in {entry["version"] for entry in group["versions"]}:
        raise _not_found()
    resources = [CRDS] if parts[0] == APIEXTENSIONS else []
    resources += [
        resource_of(crd, version)
        for crd in definitions(store)
        if crd["spec"]["group"] == parts[0] and _served(crd, version) is not None
    ]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{parts[0]}/{version}",
        "resources": [entry for r in resources for entry in _entries(r)],
    }


def _entries(resource: Resource) -> list[dict[str, Any]]:
    name = resource.plural.split(".", 1)[0]
    verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
    main = {
        "name": name,
        "singularName": resource.kind.lower(),
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": verbs,
    }
    subs = [
        {
            "name": f"{name}/{sub}",
            "singularName": "",
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": ["get", "patch", "update"],
        }
        for sub in sorted(resource.subresources)
    ]
    return [main, *subs]


# --- kubectl's tables --------------------------------------------------------------------


def wants_table(accept: str) -> bool:
    """kubectl asks ``application/json;as=Table;v=v1;g=meta.k8s.io`` first."""
    return "as=Table" in accept


def _printer_columns(store: ObjectStore, resource: Resource) -> list[dict[str, Any]]:
    for crd in definitions(store):
        if resource_of(crd, resource.version).plural == resource.plural:
            columns: list[dict[str, Any]] = (_served(crd, resource.version) or {}).get(
                "additionalPrinterColumns"
            ) or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
            return columns
    return []


def _at_path(obj: dict[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.strip(".").split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _age(stamp: Any, now: datetime) -> Any:
    """A date column as kubectl shows it (``45s``, ``12m``, ``5h3m``, ``4d2h``)."""
    try:
        seconds = int(
            (
                now - datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            ).total_seconds()
        )
    except (TypeError, ValueError):
        return stamp
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours < 3:
        return f"{minutes}m"
    if days < 2:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"


def table(
    store: ObjectStore, resource: Resource, objects: list[dict[str, Any]], now: datetime
) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of ``objects`` with the CRD's printer columns."""
    columns = _printer_columns(store, resource)
    definitions_ = [
        {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0},
        *[
            {
                "name": column["name"],
                "type": column.get("type", "string"),
                "format": column.get("format", ""),
                "description": column.get("description", ""),
                "priority": column.get("priority", 0),
            }
            for column in columns
        ],
    ]
    rows = []
    for obj in objects:
        cells = [obj["metadata"]["name"]]
        for column in columns:
            value = _at_path(obj, column["jsonPath"])
            cells.append(_age(value, now) if column.get("type") == "date" else value)
        meta = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}
        rows.append({"cells": cells, "object": {**meta, "metadata": obj["metadata"]}})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": str(store.revision)},
        "columnDefinitions": definitions_,
        "rows": rows,
    }
