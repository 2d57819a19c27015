"""Seed 002's ``kubernetes.io/gpu*`` names, renamed to gpushare's at pod creation.

Seed 002 has pods ask ``kubernetes.io/gpu: 50`` (and ``-core``, ``-memory``,
``-memory-ratio``). As asked, such a pod waits Pending for ever: ``kubernetes.io/`` is a
namespace the kubelet keeps for itself (it refuses a device plugin that registers one),
and kube-scheduler checks these "native" names itself against each node's allocatable,
which nothing fills (``Insufficient kubernetes.io/gpu``); ``ignoredByScheduler`` applies to
extended resources only. So the allocator's *mutating* webhook renames them at CREATE,
before anything schedules the pod, to the ``gpushare.io`` names the node agent serves, as
Koordinator's webhook rewrites its pods' resources. This module decides that rewrite, as
an RFC 6902 JSON Patch on the pod the kube-apiserver sent:

* In every container and init container, each ``kubernetes.io`` name of
  :data:`RENAMES`, in ``resources.limits`` and ``resources.requests``, is *moved* to its
  ``gpushare.io`` name: the value is untouched, whatever its spelling.
* A name asked in ``requests`` only is also *copied* to ``limits``: a native name may be
  asked without a limit (seed 002's examples are), an extended one may not (the
  kube-apiserver refuses it: "Limit must be set for non overcommitable resources"), and
  gpushare reads an extended resource's request and limit as one amount.
* A container that already asks the ``gpushare.io`` name (in limits or requests) keeps
  its ``kubernetes.io`` name as it is: merging the two would pick one value silently.
  Validation then refuses the pair (``duplicate-dimension``, :mod:`gpushare.core.requests`).
* The annotation :data:`REWRITTEN_ANNOTATION` records the names renamed.
* A pod with nothing to rename gets no operation, so the rewrite is idempotent: a
  rewritten pod, rewritten again, is left alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from gpushare.core.pods import Container, Pod, pod_from_dict
from gpushare.core.requests import NATIVE_RENAMES as RENAMES

REWRITTEN_ANNOTATION = "gpushare.io/rewritten-resources"
"""On a rewritten pod: the ``kubernetes.io`` names renamed, comma-separated, in
:data:`RENAMES` order; each now has its ``gpushare.io`` name."""

_LISTS = (("containers", False), ("initContainers", True))
"""The pod's JSON fields of containers, and whether they are init containers."""


class PatchOperation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One RFC 6902 operation; ``path`` and ``from`` are JSON Pointers (RFC 6901)."""

    op: str
    path: str
    from_: str = msgspec.field(default="", name="from")
    value: dict[str, str] | str | None = None


class NameAsked(msgspec.Struct, frozen=True, kw_only=True):
    """A ``kubernetes.io`` name one container asks."""

    container: str
    init: bool
    name: str

    def describe(self) -> str:
        role = "init container" if self.init else "container"
        return f"{role} {self.container!r}: {self.name} -> {RENAMES[self.name]}"


class Rewrite(msgspec.Struct, frozen=True, kw_only=True):
    """What the webhook answers for one pod."""

    patch: tuple[PatchOperation, ...] = ()
    """Empty when nothing is renamed."""
    renamed: tuple[NameAsked, ...] = ()
    kept: tuple[NameAsked, ...] = ()
    """Left as asked: the container asks the ``gpushare.io`` name too."""


def escape(token: str) -> str:
    """One JSON Pointer reference token: ``~`` as ``~0``, ``/`` as ``~1`` (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join(f"/{escape(str(token))}" for token in tokens)


def rewrite_native_names(pod: Pod | Mapping[str, Any]) -> Rewrite:
    """The JSON Patch renaming ``pod``'s ``kubernetes.io/gpu*`` resources (module doc).

    ``pod`` as the kube-apiserver sends it (a Pod, or its JSON-shaped dict): its containers
    are addressed by their index in it, so it must be the very object the patch applies to.
    """
    if not isinstance(pod, Pod):
        pod = pod_from_dict(dict(pod))
    patch: list[PatchOperation] = []
    renamed: list[NameAsked] = []
    kept: list[NameAsked] = []
    for container, init, at in _containers(pod):
        renaming: list[str] = []
        for asked, clash in _native_names(container, init):
            (kept if clash else renamed).append(asked)
            if not clash:
                renaming.append(asked.name)
        patch += _rename(container, at, renaming)
    if renamed:
        patch.append(_annotate(pod, renamed))
    return Rewrite(patch=tuple(patch), renamed=tuple(renamed), kept=tuple(kept))


def _containers(pod: Pod) -> Iterator[tuple[Container, bool, tuple[str | int, ...]]]:
    """Each container, whether it is an init container, and its JSON path in the pod."""
    spec = pod.spec
    for field, init in _LISTS:
        listed = (spec.init_containers or ()) if init else spec.containers
        for index, container in enumerate(listed):
            yield container, init, ("spec", field, index)


def _asked(container: Container) -> set[str]:
    resources = container.resources
    if resources is None:
        return set()
    return set(resources.limits or ()) | set(resources.requests or ())


def _native_names(container: Container, init: bool) -> Iterator[tuple[NameAsked, bool]]:
    """Each ``kubernetes.io`` name the container asks, and whether it also asks the new one."""
    asked = _asked(container)
    for old, new in RENAMES.items():
        if old in asked:
            yield NameAsked(container=container.name, init=init, name=old), new in asked


def _rename(
    container: Container, at: tuple[str | int, ...], names: list[str]
) -> list[PatchOperation]:
    """Moves (and limit copies) for ``names`` of one container."""
    resources = container.resources
    if resources is None or not names:
        return []
    limits, requests = resources.limits, resources.requests
    base = (*at, "resources")
    operations: list[PatchOperation] = []
    has_limits = limits is not None
    for old in names:
        new = RENAMES[old]
        for section, values in (("limits", limits), ("requests", requests)):
            if values is not None and old in values:
                source, target = pointer(*base, section, old), pointer(*base, section, new)
                operations.append(PatchOperation(op="move", from_=source, path=target))
        if requests is not None and old in requests and (limits is None or old not in limits):
            if not has_limits:
                operations.append(PatchOperation(op="add", path=pointer(*base, "limits"), value={}))
                has_limits = True
            source, target = pointer(*base, "requests", new), pointer(*base, "limits", new)
            operations.append(PatchOperation(op="copy", from_=source, path=target))
    return operations


def _annotate(pod: Pod, renamed: list[NameAsked]) -> PatchOperation:
    names = {asked.name for asked in renamed}
    value = ",".join(name for name in RENAMES if name in names)
    if pod.metadata.annotations is None:
        path = pointer("metadata", "annotations")
        return PatchOperation(op="add", path=path, value={REWRITTEN_ANNOTATION: value})
    path = pointer("metadata", "annotations", REWRITTEN_ANNOTATION)
    return PatchOperation(op="add", path=path, value=value)
