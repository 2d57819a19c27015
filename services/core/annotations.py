"""The annotations the binder writes with the binding, and reads back.

The ``ALIYUN_COM_GPU_MEM_*`` keys keep seeds 000/001's contract (tools such as
kubectl-inspect-gpushare read them); ``gpushare.io/allocation`` holds the whole
per-container allocation as JSON.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from gpushare.core.events import PodReserved
from gpushare.core.model import ContainerShare
from gpushare.core.requests import to_units
from gpushare.core.state import memory_by_card

IDX = "ALIYUN_COM_GPU_MEM_IDX"
POD = "ALIYUN_COM_GPU_MEM_POD"
DEV = "ALIYUN_COM_GPU_MEM_DEV"
ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ALLOCATION = "gpushare.io/allocation"
RESERVATION = "gpushare.io/reservation"


class AllocationAnnotation(msgspec.Struct, frozen=True, kw_only=True):
    """The JSON in ``gpushare.io/allocation``."""

    version: int = 1
    node: str
    reservation: str
    unit: str
    containers: dict[str, list[ContainerShare]]


def _unix_nanos(at: datetime) -> int:
    return int(at.timestamp()) * 1_000_000_000 + at.microsecond * 1000


def binding_annotations(
    reservation: PodReserved, card_memory_mib: int, memory_unit: str
) -> dict[str, str]:
    """Everything the binding writes onto the pod, in the cluster's memory unit."""
    by_card = memory_by_card(reservation.shares)
    first = reservation.shares[0]
    containers: dict[str, list[ContainerShare]] = {}
    for share in reservation.shares:
        containers.setdefault(share.container, []).append(share)
    document = AllocationAnnotation(
        node=reservation.node,
        reservation=reservation.id,
        unit=memory_unit,
        containers=containers,
    )
    return {
        IDX: str(first.card_index),
        POD: str(to_units(sum(by_card.values()), memory_unit)),
        DEV: str(to_units(card_memory_mib, memory_unit)),
        ASSUME_TIME: str(_unix_nanos(reservation.at)),
        ASSIGNED: "false",
        RESERVATION: reservation.id,
        ALLOCATION: msgspec.json.encode(document).decode(),
    }


def read_allocation(annotations: dict[str, str]) -> AllocationAnnotation | None:
    """The allocation a pod carries, or ``None`` if it has none or it is unreadable."""
    raw = annotations.get(ALLOCATION)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=AllocationAnnotation)
    except msgspec.MsgspecError:
        return None
