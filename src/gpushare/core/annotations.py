"""The annotations the binder writes with the binding, and reads back.

The ``ALIYUN_COM_GPU_MEM_*`` keys keep seeds 000/001's contract (tools such as
kubectl-inspect-gpushare read them); ``gpushare.io/allocation`` holds the whole
per-container allocation as JSON. Every container that got cards (init containers
too) also gets ``gpushare.io/gpu-index-container-<name>: "1,0"``: its card indices in
share order. A pod that asked through seed 003's ``vke.volcengine.com/*`` resources
gets the same list under ``vke.volcengine.com/gpu-index-container-<name>`` and
``vke.volcengine.com/assumed: "true"``, which is what mGPU's node agent reads.

An annotation key's name part (after the ``/``) is at most 63 characters, so a
per-container key is written only for container names of up to 43 characters; a
longer name would make the API server refuse the whole binding. Its cards are in
``gpushare.io/allocation`` either way.

Koordinator's ``scheduling.koordinator.sh/device-allocated`` (pod-level JSON: each card's
minor, core, memory and memory ratio; :mod:`gpushare.core.koordinator`) goes with them, so
koordlet and Koordinator's tools read gpushare's placements too.

The binding writes them (:func:`binding_annotations`); whenever the log moves a bound pod
to other cards (``AllocationCorrected``) the binder rewrites them in one merge patch
(:func:`moved_annotations`), and reconciliation compares a pod's annotations with
:func:`current_annotations`. All three come from the one builder,
:func:`allocation_annotations`.

See ``docs/design/pod-results.md`` and ``docs/reconciliation.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import msgspec

from gpushare.core.events import PodReserved
from gpushare.core.koordinator import DEVICE_ALLOCATED, device_allocated
from gpushare.core.model import ContainerShare
from gpushare.core.pods import Container, Pod
from gpushare.core.requests import SHARE_RESOURCES, to_units
from gpushare.core.state import PodAllocation, memory_by_card

IDX = "ALIYUN_COM_GPU_MEM_IDX"
POD = "ALIYUN_COM_GPU_MEM_POD"
DEV = "ALIYUN_COM_GPU_MEM_DEV"
ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ALLOCATION = "gpushare.io/allocation"
RESERVATION = "gpushare.io/reservation"
GPU_INDEX_CONTAINER = "gpushare.io/gpu-index-container-"
"""Prefix of the per-container card list; the container's name follows."""
VKE_GPU_INDEX_CONTAINER = "vke.volcengine.com/gpu-index-container-"
"""Seed 003's per-container card list, written for pods that asked in mGPU's names."""
VKE_ASSUMED = "vke.volcengine.com/assumed"
"""Seed 003: ``"true"`` once the scheduler placed the pod's mGPU resources."""
VKE_DOMAIN = "vke.volcengine.com/"

MAX_KEY_NAME_LENGTH = 63
"""Kubernetes' limit on the name part of an annotation key (after the prefix's ``/``)."""


class AllocationAnnotation(msgspec.Struct, frozen=True, kw_only=True):
    """The JSON in ``gpushare.io/allocation``."""

    version: int = 1
    node: str
    reservation: str
    unit: str
    containers: dict[str, list[ContainerShare]]


def _unix_nanos(at: datetime) -> int:
    return int(at.timestamp()) * 1_000_000_000 + at.microsecond * 1000


def _asked(container: Container) -> tuple[str, ...]:
    resources = container.resources
    if resources is None:
        return ()
    named = {*(resources.limits or {}), *(resources.requests or {})}
    return tuple(sorted(named & SHARE_RESOURCES))


def asked_resources(pod: Pod) -> dict[str, tuple[str, ...]]:
    """Container → the GPU resource names it asks (limits or requests), sorted.

    Init and app containers alike; a container that asks none is left out.
    """
    containers = (*(pod.spec.init_containers or ()), *pod.spec.containers)
    asked = {container.name: _asked(container) for container in containers}
    return {name: names for name, names in asked.items() if names}


def asks_mgpu(asked: Mapping[str, Sequence[str]]) -> bool:
    """Whether any container asked through seed 003's ``vke.volcengine.com/*`` resources."""
    return any(name.startswith(VKE_DOMAIN) for names in asked.values() for name in names)


def shares_by_container(shares: Iterable[ContainerShare]) -> dict[str, list[ContainerShare]]:
    """Each container's shares, in share order; containers in order of their first share."""
    containers: dict[str, list[ContainerShare]] = {}
    for share in shares:
        containers.setdefault(share.container, []).append(share)
    return containers


def container_key(prefix: str, container: str) -> str | None:
    """``prefix`` + ``container``, or ``None`` when that is not a valid annotation key."""
    key = prefix + container
    name = key.rpartition("/")[2]
    return key if 0 < len(name) <= MAX_KEY_NAME_LENGTH else None


def card_indices(shares: Sequence[ContainerShare]) -> str:
    """``"1,0"``: the cards of one container's shares, in share order."""
    return ",".join(str(share.card_index) for share in shares)


def index_annotations(
    containers: Mapping[str, Sequence[ContainerShare]], mgpu: bool = False
) -> dict[str, str]:
    """``gpushare.io/gpu-index-container-<name>`` per container (and mGPU's keys if ``mgpu``)."""
    prefixes = (GPU_INDEX_CONTAINER, VKE_GPU_INDEX_CONTAINER) if mgpu else (GPU_INDEX_CONTAINER,)
    annotations: dict[str, str] = {}
    for container, shares in containers.items():
        for prefix in prefixes:
            key = container_key(prefix, container)
            if key is not None:
                annotations[key] = card_indices(shares)
    if mgpu:
        annotations[VKE_ASSUMED] = "true"
    return annotations


def allocation_annotations(
    *,
    node: str,
    reservation_id: str,
    shares: Sequence[ContainerShare],
    reserved_at: datetime,
    card_memory_mib: int,
    memory_unit: str,
    mgpu: bool = False,
    assigned: bool = False,
) -> dict[str, str]:
    """Every key that describes an allocation, in the cluster's memory unit: the one
    builder behind the binding and every later rewrite.

    ``card_memory_mib`` is the memory of the first card (``ALIYUN_COM_GPU_MEM_DEV``);
    ``mgpu`` adds seed 003's ``vke.volcengine.com/*`` keys (see :func:`asks_mgpu`);
    ``assigned`` is ``ALIYUN_COM_GPU_MEM_ASSIGNED``.
    """
    by_card = memory_by_card(shares)
    containers = shares_by_container(shares)
    document = AllocationAnnotation(
        node=node, reservation=reservation_id, unit=memory_unit, containers=containers
    )
    return {
        IDX: str(shares[0].card_index),
        POD: str(to_units(sum(by_card.values()), memory_unit)),
        DEV: str(to_units(card_memory_mib, memory_unit)),
        ASSUME_TIME: str(_unix_nanos(reserved_at)),
        ASSIGNED: "true" if assigned else "false",
        RESERVATION: reservation_id,
        ALLOCATION: msgspec.json.encode(document).decode(),
        DEVICE_ALLOCATED: device_allocated(shares, card_memory_mib),
        **index_annotations(containers, mgpu),
    }


def binding_annotations(
    reservation: PodReserved,
    card_memory_mib: int,
    memory_unit: str,
    *,
    mgpu: bool = False,
    shares: Sequence[ContainerShare] | None = None,
) -> dict[str, str]:
    """Everything the binding writes onto the pod: the reservation, not assigned yet.

    ``shares`` replaces the reservation's when the log has corrected them already.
    """
    return allocation_annotations(
        node=reservation.node,
        reservation_id=reservation.id,
        shares=shares or reservation.shares,
        reserved_at=reservation.at,
        card_memory_mib=card_memory_mib,
        memory_unit=memory_unit,
        mgpu=mgpu,
    )


def current_annotations(
    allocation: PodAllocation, node: str, card_memory_mib: int, memory_unit: str, *, mgpu: bool
) -> dict[str, str]:
    """What a bound pod's annotations say when they follow the log's ``allocation`` (on
    ``node``): the binding's keys for its shares as they are now, ``ASSIGNED`` as the
    fold has it. ``DEV`` is left out while the card's memory is unknown (0); so is the memory
    ratio in Koordinator's ``device-allocated``, whose minors still follow the log."""
    annotations = allocation_annotations(
        node=node,
        reservation_id=allocation.reservation_id,
        shares=allocation.shares,
        reserved_at=allocation.reserved_at,
        card_memory_mib=card_memory_mib,
        memory_unit=memory_unit,
        mgpu=mgpu,
        assigned=allocation.bound and allocation.fully_assigned,
    )
    if card_memory_mib <= 0:
        del annotations[DEV]
    return annotations


def moved_annotations(
    allocation: PodAllocation, node: str, card_memory_mib: int, memory_unit: str, *, mgpu: bool
) -> dict[str, str]:
    """The one merge patch that makes a moved pod's annotations name its new cards:
    :func:`current_annotations` less the assume time (the reservation's, written at bind
    and unchanged by a move) and less ``ASSIGNED`` until every container is assigned (only
    the marker turns it to ``"true"``, and nothing may turn it back)."""
    annotations = current_annotations(allocation, node, card_memory_mib, memory_unit, mgpu=mgpu)
    del annotations[ASSUME_TIME]
    if annotations[ASSIGNED] != "true":
        del annotations[ASSIGNED]
    return annotations


def read_allocation(annotations: dict[str, str]) -> AllocationAnnotation | None:
    """The allocation a pod carries, or ``None`` if it has none or it is unreadable."""
    raw = annotations.get(ALLOCATION)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=AllocationAnnotation)
    except (msgspec.MsgspecError, UnicodeError):
        return None
