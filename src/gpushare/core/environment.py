"""The environment the device plugin gives a container.

* ``NVIDIA_VISIBLE_DEVICES``: every card the container got, by UUID (which survives
  index changes), comma-separated in share order; ``GPUSHARE_VISIBLE_INDICES``: the
  same cards by NVML index.
* Limit hints for applications, on shared cards only: ``GPUSHARE_MEMORY_LIMIT_MIB``
  (MiB on each card; one number when equal on every card, else a list in card order)
  and ``GPUSHARE_CORE_PERCENT`` (when a compute share was asked). gpushare does not
  enforce them; MPS does, below.
* On a node whose cards an MPS control daemon serves: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  (``<uuid>=<N>M`` per card, comma-separated: NVIDIA's MPS format of device ordinal or
  UUID, ``=``, limit; UUIDs because ordinals inside a container are CUDA's enumeration
  of the visible cards, not the node's indices) and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
  (the core percent; left out when no compute share was asked).
* Seeds 000/001's ``ALIYUN_COM_GPU_MEM_*`` variables for containers that asked
  ``aliyun.com/gpu-mem``.

A container of whole cards (``nvidia.com/gpu``, core 100 per card, ...) gets its cards
and no limits. See ``docs/design/pod-results.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpushare.core.model import Card, ContainerShare
from gpushare.core.requests import WHOLE, to_units

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VISIBLE_INDICES = "GPUSHARE_VISIBLE_INDICES"
MEMORY_LIMIT = "GPUSHARE_MEMORY_LIMIT_MIB"
CORE_PERCENT = "GPUSHARE_CORE_PERCENT"
MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def is_whole_card(share: ContainerShare, card: Card) -> bool:
    """The share is the whole card: all of its compute and all of its memory."""
    return share.core_percent >= WHOLE and share.memory_mib >= card.memory_mib


def _one_or_list(values: Sequence[int]) -> str:
    """``"4096"`` when every card has the same value, else ``"4096,2048"`` in card order."""
    if len(set(values)) == 1:
        return str(values[0])
    return ",".join(str(value) for value in values)


def _limits(shares: Sequence[ContainerShare], mps: bool) -> dict[str, str]:
    memory = [share.memory_mib for share in shares]
    core = max(share.core_percent for share in shares)
    env: dict[str, str] = {}
    if any(memory):
        env[MEMORY_LIMIT] = _one_or_list(memory)
    if core:
        env[CORE_PERCENT] = _one_or_list([share.core_percent for share in shares])
    if mps and any(memory):
        env[MPS_MEMORY_LIMIT] = ",".join(
            f"{share.card_uuid}={share.memory_mib}M" for share in shares
        )
    if mps and core:
        env[MPS_THREAD_PERCENTAGE] = str(core)
    return env


def _aliyun(
    share: ContainerShare, card: Card, pod_memory_mib: int, memory_unit: str
) -> dict[str, str]:
    """Seed 000's variables: one card, and the pod's and container's memory in units."""
    return {
        "ALIYUN_COM_GPU_MEM_IDX": str(card.index),
        "ALIYUN_COM_GPU_MEM_POD": str(to_units(pod_memory_mib, memory_unit)),
        "ALIYUN_COM_GPU_MEM_CONTAINER": str(to_units(share.memory_mib, memory_unit)),
        "ALIYUN_COM_GPU_MEM_DEV": str(to_units(card.memory_mib, memory_unit)),
        "ALIYUN_COM_GPU_MEM_UNIT": memory_unit,
    }


def container_environment(
    shares: Sequence[ContainerShare],
    cards: Mapping[str, Card],
    *,
    pod_memory_mib: int,
    memory_unit: str,
    mps: bool = False,
    aliyun: bool = True,
) -> dict[str, str]:
    """One container's variables from its ``shares`` (one per card, in share order).

    ``cards`` maps card UUID to the node's card; ``pod_memory_mib`` is what the whole pod
    holds (seed 000's ``ALIYUN_COM_GPU_MEM_POD``); ``mps``: the node runs MPS;
    ``aliyun``: the container asked ``aliyun.com/gpu-mem``. Raises ``KeyError`` for a
    share on a card not in ``cards`` and ``ValueError`` for no shares.
    """
    if not shares:
        raise ValueError("a container without shares gets no GPU environment")
    first_per_card: dict[str, ContainerShare] = {}
    for share in shares:
        first_per_card.setdefault(share.card_uuid, share)
    ordered = list(first_per_card.values())
    on = [cards[share.card_uuid] for share in ordered]
    env = {
        VISIBLE_DEVICES: ",".join(card.uuid for card in on),
        VISIBLE_INDICES: ",".join(str(card.index) for card in on),
    }
    if not all(is_whole_card(share, card) for share, card in zip(ordered, on, strict=True)):
        env.update(_limits(ordered, mps))
    if aliyun:
        env.update(_aliyun(ordered[0], on[0], pod_memory_mib, memory_unit))
    return env
