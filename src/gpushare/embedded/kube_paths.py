"""Reading ``/api/v1/...`` paths into what they address.

The core group's paths overlap (``/api/v1/namespaces/x/pods`` is both "the pods of
namespace x" and, by shape, "subresource pods of namespace x"), so they are parsed by
hand rather than by route patterns: a known namespaced resource after
``namespaces/<ns>/`` wins, as in the apiserver's request-info resolver.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushare.embedded.kube_objects import RESOURCES, Resource
from gpushare.embedded.kube_status import StatusError

BINDINGS = "bindings"
"""The legacy ``POST /api/v1/namespaces/{ns}/bindings``: create-only, no storage."""


@dataclass(frozen=True)
class Target:
    resource: Resource
    namespace: str = ""
    """The URL's namespace; ``""`` for cluster-scoped resources or across all namespaces."""
    name: str = ""
    subresource: str = ""
    legacy_binding: bool = False

    @property
    def is_collection(self) -> bool:
        return not self.name


def _not_found() -> StatusError:
    return StatusError(404, "the server could not find the requested resource")


def _resource(plural: str) -> Resource:
    resource = RESOURCES.get(plural)
    if resource is None:
        raise _not_found()
    return resource


def _namespaced(parts: list[str]) -> Target:
    namespace, plural, rest = parts[1], parts[2], parts[3:]
    if plural == BINDINGS and not rest:
        return Target(RESOURCES["pods"], namespace, legacy_binding=True)
    resource = _resource(plural)
    if not resource.namespaced or len(rest) > 2:
        raise _not_found()
    name = rest[0] if rest else ""
    subresource = rest[1] if len(rest) == 2 else ""
    return Target(resource, namespace, name, subresource)


def _is_namespaced_path(parts: list[str]) -> bool:
    if parts[0] != "namespaces" or len(parts) < 3:
        return False
    plural = parts[2]
    return plural == BINDINGS or (plural in RESOURCES and RESOURCES[plural].namespaced)


def parse_target(tail: str) -> Target:
    """``tail`` is the path after ``/api/v1/``."""
    parts = [part for part in tail.split("/") if part]
    if not parts:
        raise _not_found()
    if _is_namespaced_path(parts):
        target = _namespaced(parts)
    else:
        resource = _resource(parts[0])
        if len(parts) > 3 or (resource.namespaced and len(parts) > 1):
            raise _not_found()
        name = parts[1] if len(parts) > 1 else ""
        subresource = parts[2] if len(parts) > 2 else ""
        target = Target(resource, "", name, subresource)
    if target.subresource and target.subresource not in target.resource.subresources:
        raise _not_found()
    return target
