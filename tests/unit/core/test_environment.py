"""The environment handed to a container at kubelet admission."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpushare.core.environment import container_environment, is_whole_card
from gpushare.core.model import Card, ContainerShare
from tests.unit.core.factories import V100, make_card

CARDS = {card.uuid: card for card in (make_card(i, node="n1") for i in range(4))}


def share(index: int, mib: int, core: int = 0, init: bool = False) -> ContainerShare:
    return ContainerShare(
        container="c0",
        card_index=index,
        card_uuid=f"GPU-n1-{index}",
        memory_mib=mib,
        core_percent=core,
        init=init,
    )


@pytest.mark.parametrize(
    ("unit", "pod", "container", "dev"),
    [
        pytest.param("MiB", "8192", "3072", "16276", id="MiB"),
        pytest.param("GiB", "8", "3", "15", id="GiB"),
    ],
)
def test_aliyun_single_card_keeps_seed_000s_variables(
    unit: str, pod: str, container: str, dev: str
) -> None:
    env = container_environment([share(2, 3072)], CARDS, pod_memory_mib=8192, memory_unit=unit)
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-n1-2",
        "GPUSHARE_VISIBLE_INDICES": "2",
        "ALIYUN_COM_GPU_MEM_IDX": "2",
        "ALIYUN_COM_GPU_MEM_POD": pod,
        "ALIYUN_COM_GPU_MEM_CONTAINER": container,
        "ALIYUN_COM_GPU_MEM_DEV": dev,
        "ALIYUN_COM_GPU_MEM_UNIT": unit,
        "GPUSHARE_MEMORY_LIMIT_MIB": "3072",
    }


@dataclass
class Case:
    shares: list[ContainerShare]
    expected: dict[str, str]
    mps: bool = False
    absent: list[str] = field(default_factory=list)


WHOLE = ["GPUSHARE_MEMORY_LIMIT_MIB", "GPUSHARE_CORE_PERCENT", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]

CASES = {
    "multi-card container: every card, in share order": Case(
        [share(1, 5000, 33), share(0, 5000, 33), share(3, 5000, 33)],
        {
            "NVIDIA_VISIBLE_DEVICES": "GPU-n1-1,GPU-n1-0,GPU-n1-3",
            "GPUSHARE_VISIBLE_INDICES": "1,0,3",
            "GPUSHARE_MEMORY_LIMIT_MIB": "5000",
            "GPUSHARE_CORE_PERCENT": "33",
        },
        absent=["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
    ),
    "memory differing per card: a list in card order": Case(
        [share(2, 4096), share(0, 2048)],
        {"GPUSHARE_MEMORY_LIMIT_MIB": "4096,2048", "NVIDIA_VISIBLE_DEVICES": "GPU-n1-2,GPU-n1-0"},
        absent=["GPUSHARE_CORE_PERCENT"],
    ),
    "MPS on: per-card memory by UUID, and the thread percentage": Case(
        [share(1, 4000, 50), share(2, 4000, 50)],
        {
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-n1-1=4000M,GPU-n1-2=4000M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
            "GPUSHARE_CORE_PERCENT": "50",
        },
        mps=True,
    ),
    "MPS on, memory only: no thread percentage": Case(
        [share(0, 3072)],
        {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-n1-0=3072M"},
        mps=True,
        absent=["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "GPUSHARE_CORE_PERCENT"],
    ),
    "MPS on, core only: no memory limit": Case(
        [share(0, 0, 30)],
        {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30", "GPUSHARE_CORE_PERCENT": "30"},
        mps=True,
        absent=["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "GPUSHARE_MEMORY_LIMIT_MIB"],
    ),
    "whole cards: the cards and no limits": Case(
        [share(0, V100, 100), share(1, V100, 100)],
        {"NVIDIA_VISIBLE_DEVICES": "GPU-n1-0,GPU-n1-1", "GPUSHARE_VISIBLE_INDICES": "0,1"},
        absent=WHOLE,
    ),
    "whole cards on an MPS node: still no limits": Case(
        [share(3, V100, 100)],
        {"NVIDIA_VISIBLE_DEVICES": "GPU-n1-3"},
        mps=True,
        absent=[*WHOLE, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
    ),
    "init container: the same variables": Case(
        [share(1, 1024, init=True)],
        {"NVIDIA_VISIBLE_DEVICES": "GPU-n1-1", "GPUSHARE_MEMORY_LIMIT_MIB": "1024"},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_container_environment(case: Case) -> None:
    env = container_environment(
        case.shares, CARDS, pod_memory_mib=0, memory_unit="MiB", mps=case.mps, aliyun=False
    )
    assert {key: env.get(key) for key in case.expected} == case.expected
    for key in case.absent:
        assert key not in env
    assert not any(key.startswith("ALIYUN_COM_GPU_MEM") for key in env)


def test_aliyun_on_an_mps_node_gets_both() -> None:
    env = container_environment(
        [share(0, 2048)], CARDS, pod_memory_mib=2048, memory_unit="MiB", mps=True
    )
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2048"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "GPU-n1-0=2048M"


def test_a_card_named_twice_is_listed_once() -> None:
    env = container_environment(
        [share(0, 1024), share(0, 1024)], CARDS, pod_memory_mib=0, memory_unit="MiB"
    )
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-n1-0"


def test_no_shares_and_unknown_cards_are_errors() -> None:
    with pytest.raises(ValueError, match="without shares"):
        container_environment([], CARDS, pod_memory_mib=0, memory_unit="MiB")
    with pytest.raises(KeyError):
        container_environment([share(9, 1)], CARDS, pod_memory_mib=0, memory_unit="MiB")


@pytest.mark.parametrize(
    ("mib", "core", "whole"),
    [(V100, 100, True), (V100, 50, False), (1024, 100, False), (V100 + 1, 100, True)],
)
def test_is_whole_card(mib: int, core: int, whole: bool) -> None:
    card: Card = CARDS["GPU-n1-0"]
    assert is_whole_card(share(0, mib, core), card) is whole
