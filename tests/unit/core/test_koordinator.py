"""Koordinator's Device read as our inventory, and its device-allocated annotation written
from an allocation (shapes of koordinator-sh/koordinator apis/scheduling/v1alpha1/
device_types.go and apis/extension/device_share.go)."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.koordinator import (
    DEVICE_ALLOCATED,
    DRIVER_VERSION_LABEL,
    MODEL_LABEL,
    KoordinatorDeviceError,
    allocated_difference,
    device_allocated,
    memory_quantity,
    read_device,
    read_device_allocated,
)
from gpushare.core.model import Card, CardLink, ContainerShare
from gpushare.core.quantity import parse_quantity
from gpushare.core.state import core_by_card, memory_by_card

A100 = 40960
UUID0 = "GPU-5f1c2a9e-0000-0000-0000-000000000000"
UUID1 = "GPU-77d0aa11-0000-0000-0000-000000000001"


def gpu(
    minor: int | None,
    uuid: str,
    memory: Any = "40Gi",
    *,
    health: bool = True,
    topology: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One ``spec.devices`` entry as koordlet writes a GPU."""
    entry: dict[str, Any] = {
        "type": "gpu",
        "id": uuid,
        "health": health,
        "resources": {
            "koordinator.sh/gpu-core": "100",
            "koordinator.sh/gpu-memory": memory,
            "koordinator.sh/gpu-memory-ratio": "100",
        },
        **extra,
    }
    if minor is not None:
        entry["minor"] = minor
    if topology is not None:
        entry["topology"] = topology
    return entry


def device(*entries: Any, node: str = "gpu-a", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": node, "labels": labels, "resourceVersion": "7"},
        "spec": {"devices": list(entries)},
    }


def card(index: int, uuid: str, memory: int = A100, **health: Any) -> Card:
    return Card(index=index, uuid=uuid, model="A100-SXM4-40GB", memory_mib=memory, **health)


LABELS = {MODEL_LABEL: "A100-SXM4-40GB", DRIVER_VERSION_LABEL: "550.54.15"}


def test_a_koordlet_device_is_our_inventory() -> None:
    rdma = {"type": "rdma", "id": "0000:1f:00.0", "minor": 0, "health": True}
    topology0 = {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:3a", "busID": "0000:3b:00.0"}
    topology1 = {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:3a", "busID": "0000:3c:00.0"}
    inventory = read_device(
        device(
            gpu(1, UUID1, "42949672960", topology=topology1),  # bytes, as a plain number text
            rdma,
            gpu(0, UUID0, topology=topology0),
            **LABELS,
        )
    )
    assert inventory.node == "gpu-a"
    assert inventory.cards == (card(0, UUID0), card(1, UUID1))
    assert inventory.driver_version == "550.54.15"
    assert inventory.links == (CardLink(a=0, b=1, path="PXB"),)
    assert inventory.problems == ()


@pytest.mark.parametrize(
    ("topologies", "path"),
    [
        pytest.param(({"pcieID": "p0"}, {"pcieID": "p0"}), "PXB", id="one-pcie-switch"),
        pytest.param(({"pcieID": "p0"}, {"pcieID": "p1"}), "NODE", id="one-numa-node"),
        pytest.param(
            ({"pcieID": "p0", "nodeID": 0}, {"pcieID": "p1", "nodeID": 1}), "SYS", id="two-numa"
        ),
        pytest.param(
            ({"pcieID": "p0", "socketID": 0}, {"pcieID": "p0", "socketID": 1}),
            "SYS",
            id="two-sockets",
        ),
    ],
)
def test_links_follow_the_topology(topologies: tuple[dict[str, Any], ...], path: str) -> None:
    entries = [gpu(i, f"GPU-{i}", topology=t) for i, t in enumerate(topologies)]
    assert read_device(device(*entries)).links == (CardLink(a=0, b=1, path=path),)  # type: ignore[arg-type]


def test_no_links_unless_every_card_has_a_topology() -> None:
    inventory = read_device(device(gpu(0, UUID0, topology={"pcieID": "p0"}), gpu(1, UUID1)))
    assert inventory.links == ()


def test_an_empty_device_has_no_cards() -> None:
    inventory = read_device({"metadata": {"name": "gpu-a"}})
    assert (inventory.cards, inventory.problems, inventory.driver_version) == ((), (), "")


MALFORMED = {
    "not an object": (["gpu"], None, "spec.devices[0]: Expected `object`"),
    "minor as text": ({**gpu(0, UUID0), "minor": "0"}, None, "Expected `int | null`, got `str`"),
    "no uuid": (gpu(0, ""), None, "no id (the device's UUID); left out"),
    "no minor": (gpu(None, UUID0), None, "no minor number (got None); left out"),
    "negative minor": (gpu(-1, UUID0), None, "no minor number (got -1)"),
    "health as text": (gpu(0, UUID0, health="true"), None, "Expected `bool`, got `str`"),
    "memory missing": (
        {**gpu(0, UUID0), "resources": {"koordinator.sh/gpu-core": "100"}},
        card(
            0,
            UUID0,
            0,
            healthy=False,
            health_reason="koordinator.sh/gpu-memory: missing (and no kubernetes.io/gpu-memory)",
        ),
        f"spec.devices[0] ({UUID0}): koordinator.sh/gpu-memory: missing (and no kubernetes.io/"
        "gpu-memory); reported unhealthy",
    ),
    "memory not a quantity": (
        gpu(0, UUID0, "lots"),
        card(
            0,
            UUID0,
            0,
            healthy=False,
            health_reason="koordinator.sh/gpu-memory: not a quantity: 'lots'",
        ),
        "not a quantity: 'lots'; reported unhealthy",
    ),
    "memory under a MiB": (gpu(0, UUID0, 1000), card(0, UUID0, 0, healthy=False), "less than 1"),
    "memory over a TiB": (gpu(0, UUID0, "2Ti"), card(0, UUID0, 0, healthy=False), "1 TiB"),
}


@pytest.mark.parametrize(("entry", "kept", "words"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_entry_is_left_out_or_unhealthy_and_named(
    entry: Any, kept: Card | None, words: str
) -> None:
    inventory = read_device(device(entry, gpu(1, UUID1), **LABELS))
    assert inventory.cards[-1] == card(1, UUID1)
    (problem,) = inventory.problems
    assert words in problem
    if kept is None:
        assert len(inventory.cards) == 1
    else:
        got = inventory.cards[0]
        assert (got.index, got.uuid, got.memory_mib, got.healthy) == (
            kept.index,
            kept.uuid,
            kept.memory_mib,
            kept.healthy,
        )
        assert not kept.health_reason or got.health_reason == kept.health_reason


def test_a_repeated_uuid_or_minor_keeps_the_first() -> None:
    inventory = read_device(device(gpu(0, UUID0), gpu(1, UUID0), gpu(0, UUID1), **LABELS))
    assert inventory.cards == (card(0, UUID0),)
    assert [p.split(": ", 1)[1] for p in inventory.problems] == [
        f"UUID {UUID0} is listed twice; left out",
        "minor 0 is listed twice; left out",
    ]


SEED_002_DEVICE = """
apiVersion: scheduling.koordinator.sh/v1alpha1
kind: Device
metadata:
  name: node-1
  annotations:
    node.koordinator.sh/gpu-checkpoints: |-
      [
        {
          "podUID": "fa8983dc-bb76-4eeb-8dcc-556fbd44d7ce",
          "containerName": "cuda-container",
          "resourceName": "nvidia.com/gpu",
          "deviceIDs": ["GPU-36b27e44-b086-46f7-f2dc-73c36dc65991"]
        }
      ]
spec:
  devices:
  - health: true
    id: GPU-98583a5c-c155-9cf6-f955-03c189d3dbfb
    minor: 0
    resources:
      kubernetes.io/gpu-core: "100"
      kubernetes.io/gpu-memory: 15472384Ki
      kubernetes.io/gpu-memory-ratio: "100"
    type: gpu
  - health: true
    id: GPU-7f6410b9-bdf7-f9a5-de09-aa5ec31a7124
    minor: 1
    resources:
      kubernetes.io/gpu-core: "100"
      kubernetes.io/gpu-memory: 15472384Ki
      kubernetes.io/gpu-memory-ratio: "100"
    type: gpu
status: {}
"""
"""Seed 002's CRD example, as the proposal writes it (``kubernetes.io`` resource names)."""


def test_seed_002s_device_example_is_two_healthy_cards() -> None:
    inventory = read_device(yaml.safe_load(SEED_002_DEVICE))
    assert inventory.node == "node-1"
    assert [(c.index, c.uuid, c.memory_mib, c.healthy) for c in inventory.cards] == [
        (0, "GPU-98583a5c-c155-9cf6-f955-03c189d3dbfb", 15109, True),  # 15109.75 MiB, whole
        (1, "GPU-7f6410b9-bdf7-f9a5-de09-aa5ec31a7124", 15109, True),
    ]
    assert inventory.problems == ()


KOORDINATOR = "koordinator.sh/gpu-memory"
KUBERNETES = "kubernetes.io/gpu-memory"
MEMORY_SPELLINGS = {
    "koordinator.sh alone": ({KOORDINATOR: "16Gi"}, 16384, ""),
    "kubernetes.io alone": ({KUBERNETES: "16Gi"}, 16384, ""),
    "both, the same amount": ({KOORDINATOR: "16Gi", KUBERNETES: "16Gi"}, 16384, ""),
    "both, the same bytes written otherwise": (
        {KOORDINATOR: "16Gi", KUBERNETES: "17179869184"},
        16384,
        "",
    ),
    "both, disagreeing": (
        {KOORDINATOR: "16Gi", KUBERNETES: "15472384Ki"},
        0,
        "koordinator.sh/gpu-memory '16Gi' and kubernetes.io/gpu-memory '15472384Ki' disagree",
    ),
    "both, within one MiB but not the same": (
        {KOORDINATOR: "16Gi", KUBERNETES: "16777217Ki"},
        0,
        "disagree",
    ),
    "kubernetes.io not a quantity": (
        {KOORDINATOR: "16Gi", KUBERNETES: "lots"},
        0,
        "kubernetes.io/gpu-memory: not a quantity: 'lots'",
    ),
    "kubernetes.io under a MiB": (
        {KUBERNETES: "1Ki"},
        0,
        "kubernetes.io/gpu-memory: '1Ki' is less than 1 MiB",
    ),
}


@pytest.mark.parametrize(
    ("named", "mib", "reason"), list(MEMORY_SPELLINGS.values()), ids=list(MEMORY_SPELLINGS)
)
def test_memory_is_read_under_either_name_and_both_must_agree(
    named: dict[str, str], mib: int, reason: str
) -> None:
    entry = {**gpu(0, UUID0), "resources": {"kubernetes.io/gpu-core": "100", **named}}
    inventory = read_device(device(entry, **LABELS))
    (got,) = inventory.cards
    assert (got.memory_mib, got.healthy) == (mib, not reason)
    assert reason in got.health_reason
    assert bool(got.health_reason) == bool(reason)
    assert [reason in problem for problem in inventory.problems] == ([True] if reason else [])


@pytest.mark.parametrize(
    ("conditions", "reason"),
    [
        pytest.param((), "Koordinator: health false", id="no-condition"),
        pytest.param(
            ({"type": "Healthy", "status": "False", "reason": "XID", "message": "XID 79"},),
            "Koordinator: XID 79",
            id="condition-message",
        ),
    ],
)
def test_an_unhealthy_device_is_an_unhealthy_card(
    conditions: tuple[dict[str, str], ...], reason: str
) -> None:
    entry = gpu(0, UUID0, health=False, conditions=list(conditions))
    inventory = read_device(device(entry, **LABELS))
    assert inventory.cards == (card(0, UUID0, healthy=False, health_reason=reason),)
    assert inventory.problems == ()


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        pytest.param([], "the Device is not an object", id="a-list"),
        pytest.param({"kind": "Node", "metadata": {"name": "a"}}, "expected Device", id="kind"),
        pytest.param(
            {"apiVersion": "gpushare.io/v1alpha1", "metadata": {"name": "a"}},
            "expected Device scheduling.koordinator.sh/v1alpha1",
            id="our-own-device",
        ),
        pytest.param({"spec": {}}, "no metadata.name", id="no-name"),
        pytest.param({"metadata": "a"}, "metadata is not an object", id="metadata"),
        pytest.param(
            {"metadata": {"name": "a"}, "spec": {"devices": {}}},
            "spec.devices is not a list",
            id="devices",
        ),
    ],
)
def test_what_is_no_device_at_all_is_an_error(obj: Any, words: str) -> None:
    with pytest.raises(KoordinatorDeviceError, match=words):
        read_device(obj)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
FIELDS = st.sampled_from(["type", "id", "minor", "health", "resources", "topology", "conditions"])
ENTRY = st.dictionaries(FIELDS, JSON | st.just("gpu"), max_size=7) | st.builds(
    gpu,
    minor=st.none() | st.integers(-2, 2**40),
    uuid=st.text(max_size=4),
    memory=JSON | st.sampled_from(["16Gi", "1e9", "-1Gi", "0.5Mi", "1e400", ".Ki"]),
    health=st.booleans(),
)


@given(obj=JSON | st.builds(device, st.lists(ENTRY | JSON, max_size=5)))
def test_any_json_is_an_inventory_or_a_named_error(obj: Any) -> None:
    try:
        inventory = read_device(obj)
    except KoordinatorDeviceError as error:
        named, inventory = bool(str(error)), None
    else:
        named = True
    assert named
    if inventory is None:
        return
    indices = [c.index for c in inventory.cards]
    assert indices == sorted(set(indices))
    assert len({c.uuid for c in inventory.cards}) == len(indices)
    assert all(c.healthy or c.health_reason for c in inventory.cards)


CARDS = st.lists(st.tuples(st.integers(1, 2**20), st.booleans()), min_size=1, max_size=8).map(
    lambda specs: tuple(
        card(index, f"GPU-{index}", memory, healthy=healthy, health_reason="" if healthy else "x")
        for index, (memory, healthy) in enumerate(specs)
    )
)


def koordlet_device(cards: tuple[Card, ...]) -> dict[str, Any]:
    """What koordlet would write for ``cards`` (memory in plain bytes)."""
    entries = [
        gpu(c.index, c.uuid, str(c.memory_mib * 2**20), health=c.healthy) for c in reversed(cards)
    ]
    return device(*entries, **LABELS)


@given(cards=CARDS)
def test_cards_survive_a_trip_through_a_koordinator_device(cards: tuple[Card, ...]) -> None:
    inventory = read_device(koordlet_device(cards))
    assert [(c.index, c.uuid, c.memory_mib, c.healthy) for c in inventory.cards] == [
        (c.index, c.uuid, c.memory_mib, c.healthy) for c in cards
    ]
    assert inventory.problems == ()


# --- the annotation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mib", "text"),
    [(0, "0"), (1, "1Mi"), (1024, "1Gi"), (8192, "8Gi"), (16276, "16276Mi"), (2**20, "1Ti")],
)
def test_memory_is_written_as_kubernetes_writes_bytes(mib: int, text: str) -> None:
    assert memory_quantity(mib) == text


@given(st.integers(0, 2**40))
def test_memory_quantities_read_back(mib: int) -> None:
    assert parse_quantity(memory_quantity(mib)) == Fraction(mib * 2**20)


def share(
    container: str, index: int, mib: int, core: int = 0, init: bool = False
) -> ContainerShare:
    return ContainerShare(
        container=container,
        card_index=index,
        card_uuid=f"GPU-{index}",
        memory_mib=mib,
        core_percent=core,
        init=init,
    )


ALLOCATIONS = {
    "half a card (the issue's example)": (
        [share("c", 0, 8192, 50)],
        16384,
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50",'
        '"koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}',
    ),
    "memory only: no core; the ratio truncated as Koordinator does": (
        [share("c", 2, 4096)],
        16276,
        '{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-memory":"4Gi",'
        '"koordinator.sh/gpu-memory-ratio":"25"}}]}',
    ),
    "pod-level: containers on one card add up, cards by minor": (
        [share("a", 3, 1024, 10), share("b", 1, 2048, 20), share("c", 3, 1024, 10)],
        4096,
        '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"20",'
        '"koordinator.sh/gpu-memory":"2Gi","koordinator.sh/gpu-memory-ratio":"50"}},'
        '{"minor":3,"resources":{"koordinator.sh/gpu-core":"20",'
        '"koordinator.sh/gpu-memory":"2Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}',
    ),
    "an init container counts while it runs: the larger": (
        [share("setup", 0, 3072, init=True), share("app", 0, 1024)],
        4096,
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"3Gi",'
        '"koordinator.sh/gpu-memory-ratio":"75"}}]}',
    ),
    "whole cards": (
        [share("c", 0, A100, 100), share("c", 1, A100, 100)],
        A100,
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100",'
        '"koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"100"}},'
        '{"minor":1,"resources":{"koordinator.sh/gpu-core":"100",'
        '"koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"100"}}]}',
    ),
    "card size unknown: no ratio": (
        [share("c", 0, 1000)],
        0,
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"1000Mi"}}]}',
    ),
}


@pytest.mark.parametrize(
    ("shares", "card_mib", "text"), list(ALLOCATIONS.values()), ids=list(ALLOCATIONS)
)
def test_device_allocated(shares: list[ContainerShare], card_mib: int, text: str) -> None:
    assert DEVICE_ALLOCATED == "scheduling.koordinator.sh/device-allocated"
    assert device_allocated(shares, card_mib) == text


SHARES = st.lists(
    st.builds(
        share,
        container=st.sampled_from(["a", "b", "c"]),
        index=st.integers(0, 7),
        mib=st.integers(1, 81920),
        core=st.integers(0, 100),
        init=st.booleans(),
    ),
    min_size=1,
    max_size=6,
)


@given(shares=SHARES, card_mib=st.integers(0, 81920))
def test_device_allocated_reads_back_as_the_pod_holds_it(
    shares: list[ContainerShare], card_mib: int
) -> None:
    written = device_allocated(shares, card_mib)
    allocations = read_device_allocated(written)
    assert allocations is not None
    entries = allocations["gpu"]
    assert [e.minor for e in entries] == sorted({s.card_index for s in shares})
    memory, core = memory_by_card(shares), core_by_card(shares)
    for entry in entries:
        uuid = f"GPU-{entry.minor}"
        held = parse_quantity(entry.resources["koordinator.sh/gpu-memory"])
        assert held == memory[uuid] * 2**20
        assert int(entry.resources.get("koordinator.sh/gpu-core", "0")) == core[uuid]
        if card_mib:
            assert int(entry.resources["koordinator.sh/gpu-memory-ratio"]) == (
                memory[uuid] * 100 // card_mib
            )
    assert allocated_difference(written, written) == (False, "")


def test_koordinators_own_annotations_read_back() -> None:
    """Its scheduler's test data (numbers as well as strings) reads back."""
    text = '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":100,"koordinator.sh/gpu-memory":"81251Mi"}}],"rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":100}}]}'  # noqa: E501
    allocations = read_device_allocated(text)
    assert allocations is not None
    (entry,) = allocations["gpu"]
    assert (entry.minor, entry.resources["koordinator.sh/gpu-core"]) == (1, "100")
    assert read_device_allocated("incorrect-device-allocation") is None
    assert read_device_allocated(json.dumps({"gpu": [{"resources": {}}]})) is None


ON_0 = device_allocated([share("c", 0, 1024)], 4096)
ON_0_UNSIZED = device_allocated([share("c", 0, 1024)], 0)
ON_1 = device_allocated([share("c", 1, 1024)], 4096)


@pytest.mark.parametrize(
    ("have", "want", "write", "words"),
    [
        pytest.param(ON_0, ON_0, False, "", id="same"),
        pytest.param(ON_0, ON_0_UNSIZED, False, "", id="the-log-knows-less"),
        pytest.param(ON_0_UNSIZED, ON_0, True, "", id="the-log-knows-more"),
        pytest.param(ON_0, ON_1, True, "names minors [0], the log [1]", id="other-cards"),
        pytest.param("{", ON_0, True, "unreadable", id="unreadable"),
    ],
)
def test_how_a_pods_annotation_differs_from_the_log(
    have: str, want: str, write: bool, words: str
) -> None:
    wrote, contradiction = allocated_difference(have, want)
    assert wrote is write
    assert words in contradiction
    assert bool(contradiction) is bool(words)
