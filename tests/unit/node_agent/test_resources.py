"""Which resources are advertised, with how many device IDs, and which one keys a container."""

from __future__ import annotations

import pytest

from gpushare.core.model import ContainerShare
from gpushare.core.plugin_resources import (
    DEFAULT_DIALECTS,
    KEYING_ORDER,
    SOCKETS,
    advertised_resources,
    check_resource,
    keyed_resource,
    resources_of,
    share_demand,
)
from gpushare.node_agent.device_table import build_device_table
from tests.unit.node_agent.builders import card

T4, A100 = card(0, mib=15360), card(1, mib=40960)

ADVERTISED = {
    "aliyun, MiB": (("aliyun",), "MiB", {"aliyun.com/gpu-mem": 15360 + 40960}),
    "aliyun, GiB": (("aliyun",), "GiB", {"aliyun.com/gpu-mem": 15 + 40}),
    "the default: aliyun and gpushare": (
        DEFAULT_DIALECTS,
        "GiB",
        {
            "aliyun.com/gpu-mem": 55,
            "gpushare.io/gpu-memory-ratio": 200,
            "gpushare.io/gpu": 200,
            "gpushare.io/gpu-core": 200,
        },
    ),
    "koordinator aliases": (
        ("koordinator",),
        "MiB",
        {"koordinator.sh/gpu-memory-ratio": 200, "koordinator.sh/gpu-core": 200},
    ),
    "vke: core percent, memory in MiB": (
        ("vke",),
        "GiB",
        {"vke.volcengine.com/mgpu-memory": 56320, "vke.volcengine.com/mgpu-core": 200},
    ),
    "nvidia: one per card": (("nvidia",), "MiB", {"nvidia.com/gpu": 2}),
}


@pytest.mark.parametrize(
    ("dialects", "unit", "expected"), ADVERTISED.values(), ids=ADVERTISED.keys()
)
def test_advertised_resources(
    dialects: tuple[str, ...], unit: str, expected: dict[str, int]
) -> None:
    names = resources_of(dialects)
    assert advertised_resources([T4, A100], unit, names) == expected
    for name in names:  # the tables advertise exactly these counts
        assert build_device_table([T4, A100], unit, name).count == expected[name]


def test_resources_come_in_keying_order_and_each_has_a_socket() -> None:
    names = resources_of(["vke", "aliyun", "gpushare", "koordinator", "nvidia"])
    assert names == KEYING_ORDER
    assert len({SOCKETS[name] for name in names}) == len(names)
    assert all(len(SOCKETS[name]) < 40 for name in names)  # unix socket paths are short


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dialect 'hami'"):
        resources_of(["aliyun", "hami"])


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("gpushare.io/gpu-memory", "byte quantity"),
        ("koordinator.sh/gpu-memory", "byte quantity"),
        ("kubernetes.io/gpu-core", "kubernetes.io"),
        ("example.com/fpga", "not a resource"),
    ],
)
def test_resources_no_plugin_can_advertise(name: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_resource(name)
    with pytest.raises(ValueError, match=why):
        build_device_table([T4], "MiB", name)


ALL = frozenset(KEYING_ORDER)
DEFAULT = frozenset(resources_of(DEFAULT_DIALECTS))


@pytest.mark.parametrize(
    ("asked", "advertised", "keyed"),
    [
        pytest.param((), DEFAULT, "aliyun.com/gpu-mem", id="unknown: gpu-mem, as ever"),
        pytest.param((), frozenset({"gpushare.io/gpu-core"}), None, id="unknown, no gpu-mem"),
        pytest.param(
            ("aliyun.com/gpu-mem", "gpushare.io/gpu-core"),
            DEFAULT,
            "aliyun.com/gpu-mem",
            id="gpu-mem with a core share",
        ),
        pytest.param(
            ("gpushare.io/gpu-core", "gpushare.io/gpu-memory-ratio"),
            DEFAULT,
            "gpushare.io/gpu-memory-ratio",
            id="core and ratio: the ratio",
        ),
        pytest.param(
            ("gpushare.io/gpu-core", "gpushare.io/gpu-memory"),
            DEFAULT,
            "gpushare.io/gpu-core",
            id="core and bytes: the core (bytes are not a plugin resource)",
        ),
        pytest.param(("gpushare.io/gpu-memory",), DEFAULT, None, id="only bytes: none"),
        pytest.param(
            ("vke.volcengine.com/mgpu-core", "vke.volcengine.com/mgpu-memory"),
            ALL,
            "vke.volcengine.com/mgpu-memory",
            id="vke",
        ),
        pytest.param(("vke.volcengine.com/mgpu-core",), DEFAULT, None, id="vke not advertised"),
        pytest.param(("nvidia.com/gpu",), ALL, "nvidia.com/gpu", id="whole cards"),
    ],
)
def test_keyed_resource(
    asked: tuple[str, ...], advertised: frozenset[str], keyed: str | None
) -> None:
    assert keyed_resource(asked, advertised) == keyed


def demand_share(mib: int, core: int = 0) -> ContainerShare:
    return ContainerShare(
        container="c", card_index=0, card_uuid=T4.uuid, memory_mib=mib, core_percent=core
    )


@pytest.mark.parametrize(
    ("resource", "mib", "core", "expected"),
    [
        ("aliyun.com/gpu-mem", 3072, 0, 3072),
        ("gpushare.io/gpu-core", 0, 30, 30),
        ("gpushare.io/gpu", 7680, 50, 50),
        ("vke.volcengine.com/mgpu-memory", 4000, 50, 4000),
        ("nvidia.com/gpu", 15360, 100, 1),
        ("gpushare.io/gpu-memory-ratio", 15360 * 33 // 100, 0, 33),  # rounded down, back up
        ("gpushare.io/gpu-memory-ratio", 15360, 100, 100),
    ],
)
def test_share_demand(resource: str, mib: int, core: int, expected: int) -> None:
    assert share_demand(resource, demand_share(mib, core), T4, "MiB") == expected
