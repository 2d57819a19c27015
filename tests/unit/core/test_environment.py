"""The environment handed to a container at kubelet admission."""

from __future__ import annotations

import pytest

from gpushare.core.environment import container_environment
from gpushare.core.model import ContainerShare
from tests.unit.core.factories import V100, make_card


@pytest.mark.parametrize(
    ("unit", "pod", "container", "dev"),
    [
        pytest.param("MiB", "8192", "3072", "16276", id="MiB"),
        pytest.param("GiB", "8", "3", "15", id="GiB"),
    ],
)
def test_container_environment(unit: str, pod: str, container: str, dev: str) -> None:
    card = make_card(2, V100, node="n1")
    share = ContainerShare(container="c0", card_index=2, card_uuid=card.uuid, memory_mib=3072)
    assert container_environment(share, card, 8192, unit) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-n1-2",
        "ALIYUN_COM_GPU_MEM_IDX": "2",
        "ALIYUN_COM_GPU_MEM_POD": pod,
        "ALIYUN_COM_GPU_MEM_CONTAINER": container,
        "ALIYUN_COM_GPU_MEM_DEV": dev,
        "ALIYUN_COM_GPU_MEM_UNIT": unit,
        "GPUSHARE_MEMORY_LIMIT_MIB": "3072",
    }
