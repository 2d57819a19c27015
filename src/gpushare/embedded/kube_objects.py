"""What the apiserver does to an object on its way into storage, resource by resource.

These mirror the registry strategies upstream (``pkg/registry/core/{pod,node,namespace}``):
on create a pod's status is reset to ``Pending`` and its metadata gets a uid, a
creationTimestamp and a generation; updates through the main resource keep the stored
status, updates through ``/status`` keep everything but the status; a pod's spec is
immutable except for a few fields. ``bind_pod`` is ``BindingREST`` (protocols D.1).
"""

from __future__ import annotations

import copy
import secrets
import string
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpushare.embedded.kube_status import (
    bad_request,
    conflict,
    invalid,
    stale,
)


@dataclass(frozen=True)
class Resource:
    plural: str
    """What the store and error messages call it: ``pods``; ``devices.gpushare.io`` in a group."""
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    group: str = ""
    """``""`` for the core group (``/api/v1``); custom resources: :mod:`kube_custom`."""
    version: str = "v1"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES: dict[str, Resource] = {
    resource.plural: resource
    for resource in (
        Resource("pods", "Pod", True, frozenset({"status", "binding"})),
        Resource("nodes", "Node", False, frozenset({"status"})),
        Resource("namespaces", "Namespace", False, frozenset({"status"})),
        Resource("events", "Event", True),
        Resource("configmaps", "ConfigMap", True),
    )
}

IMMUTABLE_METADATA = ("uid", "creationTimestamp", "deletionTimestamp", "generation", "namespace")
MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations", "schedulingGates")


def timestamp(at: datetime | None = None) -> str:
    """RFC 3339 in whole seconds, as the apiserver writes metav1.Time."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _generated_name(prefix: str) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return prefix + "".join(secrets.choice(alphabet) for _ in range(5))


def prepare_create(resource: Resource, body: Any, namespace: str) -> dict[str, Any]:
    """The object as stored by a POST (``namespace`` is the URL's, ``""`` if cluster-scoped)."""
    if not isinstance(body, dict):
        raise bad_request("the body of the request must be a JSON object")
    obj = copy.deepcopy(body)
    obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
    meta = obj.setdefault("metadata", {})
    if resource.namespaced:
        if meta.get("namespace") not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    if not meta.get("name"):
        if not meta.get("generateName"):
            raise invalid(
                resource.kind,
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            )
        meta["name"] = _generated_name(meta["generateName"])
    for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
        meta.pop(field, None)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = timestamp()
    PREPARE_CREATE.get(resource.plural, _no_defaults)(obj)
    return obj


def _no_defaults(obj: dict[str, Any]) -> None:
    del obj


def _prepare_pod(pod: dict[str, Any]) -> None:
    name = pod["metadata"]["name"]
    spec = pod.setdefault("spec", {})
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise invalid("Pod", name, "spec.containers", "Required value")
    for index, container in enumerate(containers + (spec.get("initContainers") or [])):
        for field in ("name", "image"):
            if not isinstance(container, dict) or not container.get(field):
                raise invalid("Pod", name, f"spec.containers[{index}].{field}", "Required value")
    pod["metadata"]["generation"] = 1
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("priority", 0)
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}


def _qos_class(spec: dict[str, Any]) -> str:
    resources = [(c.get("resources") or {}) for c in spec.get("containers") or []]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        r.get("limits", {}).get(name) is not None
        and r.get("requests", {}).get(name, r["limits"][name]) == r["limits"][name]
        for r in resources
        for name in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _prepare_node(node: dict[str, Any]) -> None:
    """Nodes keep the status they are created with; allocatable defaults to capacity."""
    status = node.setdefault("status", {})
    if "capacity" in status and "allocatable" not in status:
        status["allocatable"] = dict(status["capacity"])
    node.setdefault("spec", {})


def _prepare_namespace(namespace: dict[str, Any]) -> None:
    namespace["spec"] = {"finalizers": ["kubernetes"]}
    namespace["status"] = {"phase": "Active"}


PREPARE_CREATE = {"pods": _prepare_pod, "nodes": _prepare_node, "namespaces": _prepare_namespace}


def prepare_update(
    resource: Resource, old: dict[str, Any], new: Any, subresource: str = ""
) -> dict[str, Any]:
    """The object as stored by a PUT or PATCH of the resource or its ``status``."""
    if not isinstance(new, dict):
        raise bad_request("the body of the request must be a JSON object")
    name = old["metadata"]["name"]
    meta = new.get("metadata") or {}
    if meta.get("name") not in (None, name):
        raise bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL "
            f"({name})"
        )
    version = meta.get("resourceVersion")
    if version not in (None, "") and version != old["metadata"].get("resourceVersion"):
        raise stale(resource.plural, name)
    if meta.get("uid") not in (None, "", old["metadata"].get("uid")):
        # as kube-apiserver answers a PUT or PATCH naming another uid: 422, not a 409
        problem = f'Invalid value: "{meta["uid"]}": field is immutable'
        raise invalid(resource.kind, name, "metadata.uid", problem)
    if subresource == "status":
        obj = copy.deepcopy(old)
        obj["status"] = copy.deepcopy(new.get("status") or {})
        return obj
    obj = copy.deepcopy(new)
    obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
    obj["metadata"] = dict(meta, name=name)
    for field in IMMUTABLE_METADATA:
        obj["metadata"].pop(field, None)
        if field in old["metadata"]:
            obj["metadata"][field] = old["metadata"][field]
    if "status" in old:
        obj["status"] = copy.deepcopy(old["status"])
    if resource.plural == "pods":
        _check_pod_spec(name, old.get("spec") or {}, obj.get("spec") or {})
    return obj


def _without_mutable(spec: dict[str, Any]) -> dict[str, Any]:
    kept = {key: value for key, value in spec.items() if key not in MUTABLE_POD_SPEC}
    for group in ("containers", "initContainers"):
        if group in kept:
            kept[group] = [{k: v for k, v in c.items() if k != "image"} for c in kept[group]]
    return kept


def _check_pod_spec(name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    if _without_mutable(old) != _without_mutable(new):
        raise invalid(
            "Pod",
            name,
            "spec",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
            " `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
            "`spec.tolerations` (only additions to existing tolerations) or "
            "`spec.schedulingGates`",
        )


def unchanged(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A write that changes nothing stores nothing and bumps no resourceVersion."""
    strip = ("resourceVersion",)
    old_meta = {k: v for k, v in old.get("metadata", {}).items() if k not in strip}
    new_meta = {k: v for k, v in new.get("metadata", {}).items() if k not in strip}
    return old_meta == new_meta and {k: v for k, v in old.items() if k != "metadata"} == {
        k: v for k, v in new.items() if k != "metadata"
    }


def bind_pod(pod: dict[str, Any], binding: Any, url_name: str | None) -> dict[str, Any]:
    """``BindingREST.Create``: the pod with its node, the Binding's annotations, PodScheduled."""
    if not isinstance(binding, dict):
        raise bad_request("the body of the request must be a JSON object")
    meta = binding.get("metadata") or {}
    name = meta.get("name") or ""
    if url_name is not None and name != url_name:
        raise bad_request("name in URL does not match name in Binding object")
    target = binding.get("target") or {}
    if target.get("kind") not in (None, "", "Node"):
        raise invalid("Binding", name, "target.kind", f'Unsupported value: "{target["kind"]}"')
    if not target.get("name"):
        raise invalid("Binding", name, "target.name", "Required value")
    _check_preconditions("pods/binding", pod, meta)
    spec = pod.get("spec") or {}
    if pod["metadata"].get("deletionTimestamp"):
        raise conflict(
            "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
        )
    if spec.get("nodeName"):
        raise conflict(
            "pods/binding", name, f'pod {name} is already assigned to node "{spec["nodeName"]}"'
        )
    if spec.get("schedulingGates"):
        raise conflict("pods/binding", name, f"pod {name} has non-empty .spec.schedulingGates")
    return _bound(pod, target["name"], meta.get("annotations") or {})


def _check_preconditions(resource: str, obj: dict[str, Any], wanted: dict[str, Any]) -> None:
    name, stored = obj["metadata"]["name"], obj["metadata"]
    uid = wanted.get("uid")
    if uid and uid != stored.get("uid"):
        raise conflict(
            resource,
            name,
            f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
            f"{stored.get('uid')}",
        )
    version = wanted.get("resourceVersion")
    if version and version != stored.get("resourceVersion"):
        raise conflict(
            resource,
            name,
            f"Precondition failed: ResourceVersion in precondition: {version}, "
            f"ResourceVersion in object meta: {stored.get('resourceVersion')}",
        )


def check_delete_preconditions(plural: str, obj: dict[str, Any], options: Any) -> None:
    """``DeleteOptions.preconditions`` (uid, resourceVersion) → 409 on mismatch."""
    preconditions = options.get("preconditions") if isinstance(options, dict) else None
    if isinstance(preconditions, dict):
        _check_preconditions(plural, obj, preconditions)


DEFAULT_GRACE_SECONDS = 30
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def grace_period(plural: str, obj: dict[str, Any], options: Any, query: str | None) -> int:
    """Seconds a DELETE leaves the object terminating (pod strategy ``CheckGracefulDelete``).

    A pod on a node gets its grace period (the request's, else its spec's, else 30 s)
    and stays, with a ``deletionTimestamp``, until its kubelet deletes it with 0; an
    unscheduled or finished pod, and every other resource, goes at once.
    """
    if plural != "pods":
        return 0
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in TERMINAL_PHASES:
        return 0
    requested = query if query not in (None, "") else None
    if requested is None and isinstance(options, dict):
        requested = options.get("gracePeriodSeconds")
    if requested is None:
        requested = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    try:
        return max(0, int(requested))
    except (TypeError, ValueError):
        raise bad_request(f"invalid gracePeriodSeconds: {requested!r}") from None


def mark_deleted(obj: dict[str, Any], grace: int) -> dict[str, Any]:
    """The object terminating: ``deletionTimestamp`` is when the grace period ends."""
    marked = copy.deepcopy(obj)
    ends = datetime.now(UTC) + timedelta(seconds=grace)
    marked["metadata"]["deletionTimestamp"] = timestamp(ends)
    marked["metadata"]["deletionGracePeriodSeconds"] = grace
    return marked


def _bound(pod: dict[str, Any], node: str, annotations: dict[str, str]) -> dict[str, Any]:
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = node
    meta = bound["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    status = bound.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    conditions.append(
        {
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": timestamp(),
        }
    )
    status["conditions"] = conditions
    return bound


def list_item(obj: dict[str, Any]) -> dict[str, Any]:
    """Items of a list carry no apiVersion/kind on the wire."""
    return {key: value for key, value in obj.items() if key not in {"apiVersion", "kind"}}
