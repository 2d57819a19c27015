"""The environment the device plugin gives a container (seed 000's variables)."""

from __future__ import annotations

from gpushare.core.model import Card, ContainerShare
from gpushare.core.requests import to_units


def container_environment(
    share: ContainerShare, card: Card, pod_memory_mib: int, memory_unit: str
) -> dict[str, str]:
    """``NVIDIA_VISIBLE_DEVICES`` names the card by UUID, which survives index changes."""
    return {
        "NVIDIA_VISIBLE_DEVICES": card.uuid,
        "ALIYUN_COM_GPU_MEM_IDX": str(card.index),
        "ALIYUN_COM_GPU_MEM_POD": str(to_units(pod_memory_mib, memory_unit)),
        "ALIYUN_COM_GPU_MEM_CONTAINER": str(to_units(share.memory_mib, memory_unit)),
        "ALIYUN_COM_GPU_MEM_DEV": str(to_units(card.memory_mib, memory_unit)),
        "ALIYUN_COM_GPU_MEM_UNIT": memory_unit,
        "GPUSHARE_MEMORY_LIMIT_MIB": str(share.memory_mib),
    }
